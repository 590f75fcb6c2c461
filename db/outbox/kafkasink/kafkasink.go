// Package kafkasink publishes outbox events to Kafka with franz-go: one
// synchronous produce per event (kgo.Client.ProduceSync), which returns once
// the brokers acknowledged the record.
//
// Use it as the Sink of an outbox.Relay:
//
//	cl, _ := kgo.NewClient(kgo.SeedBrokers("localhost:9092"))
//	sink, _ := kafkasink.New(cl, "orders")
//	relay, _ := ob.NewRelay(sink)
//
// The record's key is the event's key, its value the payload (never null:
// an empty payload is an empty value, not a tombstone), its timestamp the
// event's creation time; its headers are the event's headers (sorted by
// name) plus HeaderID, HeaderType and HeaderSeq. An event with a header of
// one of those three names is refused (ErrReservedHeader, permanent: the row
// is marked dead). With franz-go's default partitioner a
// key's records go to one partition, and the relay produces a key's events
// one at a time, in order, so a key's events land in its partition in write
// order.
//
// franz-go's producer is idempotent by default (do not set
// kgo.DisableIdempotentWrite, and keep the default acks, all in-sync
// replicas): a produce retried inside the client is written once, in order.
// New refuses a client with kgo.RequiredAcks(kgo.NoAck()), whose produce
// returns before any broker has the record: the relay would mark it sent.
// A failed produce returns an error naming the event (ID, key, seq) and the
// topic, wrapping franz-go's (errors.Is finds the kerr error); a record too
// large for the client or the broker (kerr.MessageTooLarge,
// kerr.RecordListTooLarge) fails the same way on every attempt, so its error
// is permanent (the row is marked dead at once).
//
// A topic that is a valid name but that the cluster does not have (a typo)
// fails the call with an error wrapping ErrUnknownTopic, naming the topic
// and the event, after about a second (the first call of each topic asks
// the cluster for its metadata, up to 5 times 250 ms apart; a topic found
// is not asked about again; calls of many keys for a topic not yet seen
// share one check, so the cluster gets one metadata request at a time per
// topic), or when the call's context ends first, where the produce could
// wait for the topic until the context ended (kgo.UnknownTopicRetries(-1),
// or a sink timeout shorter than franz-go's own unknown-topic retries) and
// fail with a bare context error. A call whose context ends while it waits
// for another key's check of its topic says the check was pending (wrapping
// its context's error, and ErrUnknownTopic once the cluster answered that it
// lacks the topic). A produce that franz-go fails with
// UNKNOWN_TOPIC_OR_PARTITION (a topic deleted later) wraps ErrUnknownTopic
// too. The sink remembers only topics the cluster was seen to have (bounded
// by the cluster's topics, whatever WithTopicFunc returns). The error is
// retryable, so a topic created meanwhile is used and otherwise the row is
// marked dead once the relay's retry policy gives up. A client with
// kgo.AllowAutoTopicCreation skips the check (the produce creates the
// topic).
//
// A produce the relay retries (after an error, or after a relay died between
// producing and marking the row sent) is a new record: consumers deduplicate
// on the HeaderID header (see package inbox).
//
// The sink's context (the relay's lease on the key, or its shutdown) ends a
// produce only while franz-go can still fail it safely: once its request was
// sent, the idempotent producer waits for the broker's answer, and so does
// the sink (Relay.Close then reports it as a sink call still running; if the
// broker acks, the row is marked sent). franz-go (its Produce doc) decides
// per batch by the context of the batch's first record, so records of other
// keys buffered for the same partition fail with that context's error too
// (the relay retries them, each a spent attempt). On kfake, with the broker
// holding every produce 1 s, Relay.Close with a 100 ms context returns an
// error saying the sink calls still run; their rows are marked sent once
// acked, the others stay pending (TestCloseUnderLoadMarksOnlyAckedRows).
package kafkasink

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/internal/optcheck"
	"github.com/keysched/keysched/internal/opterror"
)

// ClosedClientSnooze is how long the sink's call snoozes (keysched.Snooze:
// tried again later without spending an attempt) when the client was closed
// before the relay: the rows stay pending, none is marked dead, until the
// relay is closed (or given a new sink).
const ClosedClientSnooze = time.Second

// Headers the sink adds to every record.
const (
	HeaderID   = "keysched-event-id"
	HeaderType = "keysched-event-type"
	HeaderSeq  = "keysched-event-seq"
)

// ErrInvalidOption is wrapped by New's errors. The refusal of an Option is a
// *keysched.OptionError naming it, with this Sentinel (errors.As finds it,
// as it does every keysched module's refused option; errors.Is matches
// keysched.ErrInvalidOption too).
var ErrInvalidOption = errors.New("kafkasink: invalid option")

// ErrReservedHeader is wrapped by the sink's error (permanent: the relay
// marks the row dead) for an event with a header named HeaderID, HeaderType
// or HeaderSeq: produced next to the sink's own, a consumer could read it
// as the event's ID, type or seq. The error names the header.
var ErrReservedHeader = errors.New("kafkasink: event header has a name the sink reserves")

// An Option configures New. Options meet by keysched.Option's rule, the one
// rule of every keysched module (see its "How options meet"): the last
// WithTopicFunc wins over it and over New's topic.
type Option func(*config) error

// refused is the *keysched.OptionError of r (nil for nil), with
// ErrInvalidOption for Sentinel.
func refused(r *optcheck.Refusal) error { return opterror.New(ErrInvalidOption, r) }

type config struct {
	topicFor func(outbox.Event) (string, error)
}

// WithTopicFunc chooses each event's topic (for example by Event.Type)
// instead of the topic given to New. An error, or a topic Kafka refuses (as
// New does), makes that event's produce fail permanently: the row is marked
// dead.
func WithTopicFunc(fn func(outbox.Event) (string, error)) Option {
	return func(c *config) error {
		if r := optcheck.NotNil("WithTopicFunc", fn == nil, "a function"); r != nil {
			return refused(r)
		}
		c.topicFor = fn
		return nil
	}
}

// New returns a Sink that produces each event to topic through cl. The
// client is the caller's: the sink never closes it. Close the relay before
// the client: a sink whose client was closed snoozes each call
// (ClosedClientSnooze) rather than fail it, so the pending rows are not
// marked dead. topic may be empty only with WithTopicFunc; otherwise it must
// be a name Kafka accepts (1 to MaxTopicLen bytes of [a-zA-Z0-9._-], not "."
// or ".."), or New fails with ErrInvalidOption. A nil client, one made
// with kgo.RequiredAcks(kgo.NoAck()) (its produce returns before a broker
// has the record), one with kgo.ManualFlushing (its produce waits
// for a Flush nobody calls, past its context's end) or a transactional one
// (kgo.TransactionalID: it refuses a produce outside a transaction), is
// refused with ErrInvalidOption; for one of those three client options
// the error is a *keysched.OptionError naming it (as a refused Option's);
// a nil client, a missing or refused topic one naming New(cl) or
// New(topic). The sink returns keysched.ErrNilContext for
// a nil ctx.
func New(cl *kgo.Client, topic string, opts ...Option) (outbox.Sink, error) {
	if cl == nil {
		return nil, refused(optcheck.Refuse("New(cl)", nil, "nil *kgo.Client"))
	}
	if acks, ok := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); ok && acks == kgo.NoAck() {
		return nil, refused(optcheck.Refuse("kgo.RequiredAcks", "kgo.NoAck()", "the client's produce returns before any broker has the record, so the relay would mark unacknowledged events sent (use the default, kgo.AllISRAcks())"))
	}
	if manual, _ := cl.OptValue(kgo.ManualFlushing).(bool); manual {
		return nil, refused(optcheck.Refuse("kgo.ManualFlushing", nil, "the client's records wait in its buffer until somebody calls Flush, and a produce does not return even when its context ends, so the relay's key would be stuck"))
	}
	if id, _ := cl.OptValue(kgo.TransactionalID).(string); id != "" {
		return nil, refused(optcheck.Refuse("kgo.TransactionalID", strconv.Quote(id), "a transactional client: the sink produces outside transactions, which such a client refuses; give the sink a client of its own without TransactionalID"))
	}
	c := config{}
	if topic != "" {
		c.topicFor = func(outbox.Event) (string, error) { return topic, nil }
	}
	for i, opt := range opts {
		if opt == nil {
			return nil, refused(optcheck.NilOption(i, "Option"))
		}
		if err := opt(&c); err != nil {
			return nil, err
		}
	}
	if c.topicFor == nil {
		return nil, refused(optcheck.Refuse("New(topic)", `""`, "no topic (give one to New, or WithTopicFunc)"))
	}
	if topic != "" {
		if err := validTopic(topic); err != nil {
			return nil, refused(optcheck.Refuse("New(topic)", strconv.Quote(topic), "%v", err))
		}
	}
	topics := newTopicCheck(cl) // topic_check.go
	return func(ctx context.Context, e outbox.Event) error {
		if ctx == nil {
			return fmt.Errorf("kafkasink: produce event %s (key %q, seq %d): %w", e.ID, e.Key, e.Seq, keysched.ErrNilContext)
		}
		t, err := c.topicFor(e)
		if err == nil {
			err = validTopic(t)
		}
		if err != nil {
			return keysched.Permanent(fmt.Errorf("kafkasink: topic for event %s: %w", e.ID, err))
		}
		for _, h := range [...]string{HeaderID, HeaderType, HeaderSeq} {
			if _, ok := e.Headers[h]; ok {
				return keysched.Permanent(fmt.Errorf("%w: event %s has a header %q (the sink sets it)", ErrReservedHeader, e.ID, h))
			}
		}
		if err := topics.check(ctx, t, e); err != nil {
			return err
		}
		if err := cl.ProduceSync(ctx, Record(t, e)).FirstErr(); err != nil {
			err = fmt.Errorf("kafkasink: produce event %s (key %q, seq %d) to topic %q: %w", e.ID, e.Key, e.Seq, t, err)
			switch {
			case errors.Is(err, kgo.ErrClientClosed):
				// A local refusal, not the event's fault: spending
				// attempts on it would mark every pending row dead
				// within the retry policy's budget.
				return keysched.Snooze(err, ClosedClientSnooze)
			case errors.Is(err, kerr.UnknownTopicOrPartition):
				// franz-go gave up on the topic (kgo.UnknownTopicRetries).
				return fmt.Errorf("%w: %w", ErrUnknownTopic, err)
			case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
				// The same record is too large on every attempt.
				return keysched.Permanent(err)
			}
			return err
		}
		return nil
	}, nil
}

// MaxTopicLen is the longest topic name Kafka accepts, in bytes.
const MaxTopicLen = 249

// validTopic refuses a topic name Kafka refuses (its Topic.validate): a
// produce to one would wait for metadata that never comes, then fail with a
// retryable UNKNOWN_TOPIC_OR_PARTITION.
func validTopic(t string) error {
	switch {
	case t == "":
		return errors.New("empty topic")
	case len(t) > MaxTopicLen:
		return fmt.Errorf("topic of %d bytes (at most %d)", len(t), MaxTopicLen)
	case t == "." || t == "..":
		return fmt.Errorf("topic %q (Kafka refuses \".\" and \"..\")", t)
	}
	for i := 0; i < len(t); i++ {
		if c := t[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic %q: byte %q at %d (want [a-zA-Z0-9._-])", t, c, i)
		}
	}
	return nil
}

// Record returns the record New's sink produces for e on topic. It does not
// check e's headers: the sink refuses an event with a header named HeaderID,
// HeaderType or HeaderSeq before calling it (ErrReservedHeader).
func Record(topic string, e outbox.Event) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, len(e.Headers)+3)
	for _, k := range slices.Sorted(maps.Keys(e.Headers)) {
		hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(e.Headers[k])})
	}
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderID, Value: []byte(e.ID)},
		kgo.RecordHeader{Key: HeaderType, Value: []byte(e.Type)},
		kgo.RecordHeader{Key: HeaderSeq, Value: []byte(strconv.FormatInt(e.Seq, 10))},
	)
	v := e.Payload
	if v == nil {
		// An empty payload (SQLite reads an empty BLOB back as nil) is an
		// empty value: a null one is a tombstone, which deletes the key
		// on a compacted topic.
		v = []byte{}
	}
	return &kgo.Record{Topic: topic, Key: []byte(e.Key), Value: v, Headers: hs, Timestamp: e.CreatedAt}
}
