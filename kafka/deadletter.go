package kafka

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/durations"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Dead-letter headers. The names and the decimal-string values follow Kafka
// Connect's error-reporting convention (the __connect.errors.* headers of its
// dead-letter queue); timestamp, consumer group and attempts, which Connect
// does not write, are added in the same namespace. They are appended after
// the original record's headers.
const (
	HeaderTopic          = "__connect.errors.topic"                // original topic
	HeaderPartition      = "__connect.errors.partition"            // original partition, decimal
	HeaderOffset         = "__connect.errors.offset"               // original offset, decimal
	HeaderTimestamp      = "__connect.errors.timestamp"            // original timestamp, Unix milliseconds, decimal
	HeaderConsumerGroup  = "__connect.errors.consumer.group"       // the consumer group
	HeaderAttempts       = "__connect.errors.attempts"             // handler attempts made, decimal
	HeaderExceptionClass = "__connect.errors.exception.class.name" // the error's Go type (%T; under keysched.Permanent or Snooze, the wrapped error's), e.g. *keysched.PanicError
	HeaderMessage        = "__connect.errors.exception.message"    // the error's message (a panic: its value), at most MaxHeaderMessageBytes
	HeaderStacktrace     = "__connect.errors.exception.stacktrace" // a panic's stack, at most MaxHeaderStacktraceBytes; absent otherwise
)

// The longest HeaderMessage and HeaderStacktrace the adapter writes, in
// bytes. A longer message or stack is cut at a UTF-8 rune boundary and
// ends with " [N bytes cut]" (within the bound): written whole, a huge
// error (a handler's error carrying a whole payload, a panic's value) made
// a dead letter larger than a record the client may produce, refused with
// MESSAGE_TOO_LARGE on every retry, and its record was never finished.
const (
	MaxHeaderMessageBytes    = 16 << 10
	MaxHeaderStacktraceBytes = 64 << 10
)

// cutHeader returns b, or, when it is longer than limit bytes, its longest
// prefix ending at a rune boundary followed by " [N bytes cut]", within
// limit bytes.
func cutHeader(b []byte, limit int) []byte {
	if len(b) <= limit {
		return b
	}
	n := max(0, limit-len(fmt.Sprintf(" [%d bytes cut]", len(b))))
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return fmt.Appendf(b[:n:n], " [%d bytes cut]", len(b)-n)
}

// checkDeadLetterTopic asks the cluster, at Run's start, for the
// dead-letter topic's metadata (without creating it), so that a topic
// missing from the cluster (a typo) shows at once rather than as a
// dead-letter produce failing for ever when the first record fails for
// good. A topic the cluster does not know is asked about again, up to
// dlqCheckTries times dlqCheckGap apart (about a second in all): a topic
// created just before Run may not have reached every broker's metadata yet
// (Kafka answers UNKNOWN_TOPIC_OR_PARTITION meanwhile). It returns an error
// wrapping ErrUnknownTopic for a topic the cluster still does not have,
// one wrapping the broker's error for another refusal that does not pass
// (an unauthorized or invalid topic), and nil otherwise: no dead-letter
// topic, client options that allow auto topic creation (the first dead
// letter creates it), the topic present, another retriable refusal or no
// answer (logged at Warn: the dead-letter produce says the rest), ctx
// ended or Close started.
func (c *Consumer) checkDeadLetterTopic(ctx context.Context) error {
	if !c.dlqSet {
		return nil
	}
	if auto, _ := c.cl.OptValue(kgo.AllowAutoTopicCreation).(bool); auto {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	topic := c.cfg.dlqTopic
	for try := 1; ; try++ {
		known, err := c.dlqTopicKnown(ctx, topic)
		if known || err != nil {
			return err
		}
		if try == dlqCheckTries {
			return fmt.Errorf("%w: dead-letter topic %q (WithDeadLetterTopic) is not in the cluster's metadata (asked %d times over %v): create it, or allow auto topic creation (kgo.AllowAutoTopicCreation)",
				ErrUnknownTopic, topic, dlqCheckTries, time.Duration(dlqCheckTries-1)*dlqCheckGap)
		}
		t := time.NewTimer(dlqCheckGap)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil // Close started, or ctx ended: Run says so
		}
	}
}

// How checkDeadLetterTopic asks again about a topic the cluster does not
// know.
const (
	dlqCheckTries = 5
	dlqCheckGap   = 250 * time.Millisecond
)

// dlqTopicKnown asks the cluster once for topic's metadata: known true
// when it has the topic, or when the check cannot tell (no answer, ctx
// ended, a retriable refusal other than an unknown topic: logged at Warn);
// err for a refusal that does not pass.
func (c *Consumer) dlqTopicKnown(ctx context.Context, topic string) (known bool, err error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = false
	resp, err := req.RequestWith(ctx, c.cl)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("kafka: run: could not check that the dead-letter topic exists", "topic", topic, "err", err)
		}
		return true, nil
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		err := kerr.ErrorForCode(t.ErrorCode)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, kerr.UnknownTopicOrPartition):
			return false, nil
		case kerr.IsRetriable(err):
			c.log.Warn("kafka: run: could not check that the dead-letter topic exists", "topic", topic, "err", err)
			return true, nil
		default:
			return false, fmt.Errorf("kafka: run: dead-letter topic %q (WithDeadLetterTopic): %w", topic, err)
		}
	}
	return false, nil
}

// deadLetter is the scheduler's dead-letter function: a record failed for
// good. It is finished only once its dead letter is acknowledged; records
// interrupted by a revoke or Close, and those of partitions no longer owned,
// are neither dead-lettered nor finished.
func (c *Consumer) deadLetter(dl keysched.DeadLetter[schedKey]) {
	if errors.Is(dl.Err, keysched.ErrAborted) {
		return // Close gave up before it ran
	}
	g := c.failed(dl.Key, nil)
	if g == nil {
		return // not a failure of a running group (a revoke cancelled it while queued)
	}
	it := g.current() // the record the failed attempts were counted for (see group)
	if it == nil || it.wasInterrupted() {
		return
	}
	p := it.p
	if !p.enter(true) {
		return
	}
	defer p.leave()
	if slices.Contains(c.sched.Parked(), dl.Key) {
		it.lastErr.Store(&dl.Err)
		c.parkMu.Lock()
		c.parked[dl.Key] = it
		c.parkMu.Unlock()
		return
	}
	if err := c.produceDeadLetter(p.ctx, it, dl.Err, true); err != nil {
		return // not finished: the next owner handles it
	}
	it.finish()
	g.handOn(g.cur + 1) // the group's later records, before the key moves on
}

// keyschedWrappers are the types of keysched's markers, Permanent and
// Snooze: unexported wrappers that add nothing to the error's message.
var keyschedWrappers = [...]reflect.Type{
	reflect.TypeOf(keysched.Permanent(errors.New(""))),
	reflect.TypeOf(keysched.Snooze(errors.New(""), 0)),
}

// errorClass names err's Go type (%T) for HeaderExceptionClass. A handler's
// error wrapped by keysched.Permanent or keysched.Snooze (outermost, nested
// in any order) is named by the error inside: the class a dead letter reports
// is the handler's, never *keysched.permanentError. A wrapper of another
// kind (fmt.Errorf's %w) is the error's class and is kept.
func errorClass(err error) string {
	for {
		t := reflect.TypeOf(err)
		if !slices.Contains(keyschedWrappers[:], t) {
			return fmt.Sprintf("%T", err)
		}
		inner := errors.Unwrap(err)
		if inner == nil {
			return fmt.Sprintf("%T", err)
		}
		err = inner
	}
}

// dlqSlow is how long a dead-letter produce may go unacknowledged before
// the log says the dead-letter topic is failing.
const dlqSlow = 2 * time.Second

var errDeadLetterSlow = fmt.Errorf("kafka: dead letter not acknowledged within %v (franz-go is retrying it)", dlqSlow)

// produceDeadLetter writes it's dead letter and waits for the broker's
// acknowledgement; with retry, a failure is retried (100 ms doubling to 10 s)
// until ctx ends. Without a dead-letter topic it logs the record.
func (c *Consumer) produceDeadLetter(ctx context.Context, it *item, cause error, retry bool) error {
	r := it.record()
	if r == nil {
		return nil // finished meanwhile (a record is finished once)
	}
	if !c.dlqSet {
		c.log.Error("kafka: record failed for good (no dead-letter topic: logged and counted finished)",
			"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "attempts", it.attempts.Load(), "err", cause)
		c.deadLettered.Add(1)
		return nil
	}
	hs := make([]kgo.RecordHeader, 0, len(r.Headers)+9)
	hs = append(hs, r.Headers...)
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderPartition, Value: strconv.AppendInt(nil, int64(r.Partition), 10)},
		kgo.RecordHeader{Key: HeaderOffset, Value: strconv.AppendInt(nil, r.Offset, 10)},
		kgo.RecordHeader{Key: HeaderTimestamp, Value: strconv.AppendInt(nil, r.Timestamp.UnixMilli(), 10)},
		kgo.RecordHeader{Key: HeaderConsumerGroup, Value: []byte(c.group)},
		kgo.RecordHeader{Key: HeaderAttempts, Value: strconv.AppendInt(nil, int64(it.attempts.Load()), 10)},
	)
	msg, class := "", "<nil>"
	if cause != nil {
		// fmt, not cause.Error(): an Error method that panics (a nil
		// *T returned as a non-nil error) panicked the dead-letter
		// function, and the record was never finished.
		msg, class = fmt.Sprint(cause), errorClass(cause)
	}
	var pe *keysched.PanicError
	if errors.As(cause, &pe) {
		msg = fmt.Sprint(pe.Value)
	}
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderExceptionClass, Value: []byte(class)},
		kgo.RecordHeader{Key: HeaderMessage, Value: cutHeader([]byte(msg), MaxHeaderMessageBytes)},
	)
	if pe != nil {
		hs = append(hs, kgo.RecordHeader{Key: HeaderStacktrace, Value: cutHeader(pe.Stack, MaxHeaderStacktraceBytes)})
	}
	dead := &kgo.Record{Topic: c.cfg.dlqTopic, Key: r.Key, Value: r.Value, Headers: hs}
	backoff := 100 * time.Millisecond
	for {
		// franz-go retries a retriable refusal (NOT_LEADER_FOR_PARTITION...)
		// inside ProduceSync without a word, and its context does not end
		// a record already sent: a produce not acknowledged within
		// dlqSlow counts as failing, so that the log says so.
		slow := time.AfterFunc(dlqSlow, func() {
			c.dlqLog.fail(errDeadLetterSlow, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "dead_letter_topic", c.cfg.dlqTopic)
		})
		err := c.cl.ProduceSync(ctx, dead).FirstErr()
		slow.Stop()
		if err == nil {
			c.dlqLog.ok()
			c.deadLettered.Add(1)
			return nil
		}
		if ctx.Err() == nil {
			// One line per state change (failing, still failing, recovered):
			// the record stays unfinished and its key waits meanwhile.
			c.dlqLog.fail(err, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "dead_letter_topic", c.cfg.dlqTopic)
		}
		if !retry || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(durations.Mul(backoff, 2), 10*time.Second)
	}
}

// A ParkedKey is a key stopped on a failed record (with the scheduler's
// keysched.Park failure policy): its later records wait, and its partition's
// frontier stays at that record, until Resume or Skip.
type ParkedKey struct {
	Topic     string
	Partition int32
	// Key is the record key (nil for the nil-key chain). Under
	// PartitionOrder a whole partition parks, and Key is the failed
	// record's.
	Key []byte
	// Offset, Attempts and Err describe the failed record: its offset, the
	// handler attempts made, the last error.
	Offset   int64
	Attempts int
	Err      error
}

// Parked returns the keys parked now, of partitions this member owns, in no
// particular order.
func (c *Consumer) Parked() []ParkedKey {
	if c.zero() {
		return nil
	}
	c.parkMu.Lock()
	defer c.parkMu.Unlock()
	out := make([]ParkedKey, 0, len(c.parked))
	for _, it := range c.parked {
		if it.p.state.Load() == stGone {
			continue
		}
		r := it.record()
		if r == nil {
			continue // finished meanwhile
		}
		var err error
		if e := it.lastErr.Load(); e != nil {
			err = *e
		}
		out = append(out, ParkedKey{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Offset: r.Offset, Attempts: int(it.attempts.Load()), Err: err})
	}
	return out
}

func (c *Consumer) parkedKey(k ParkedKey) schedKey {
	r := &kgo.Record{Topic: k.Topic, Partition: k.Partition, Key: k.Key, Offset: k.Offset}
	return c.keyOf(r)
}

// takeParked removes k from the parked set.
func (c *Consumer) takeParked(k ParkedKey) (schedKey, *item, error) {
	if c.zero() {
		return schedKey{}, nil, ErrZeroConsumer
	}
	sk := c.parkedKey(k)
	c.parkMu.Lock()
	defer c.parkMu.Unlock()
	// Under parkMu: Close's check that only parked keys are left
	// (onlyParkedLeft) reads the parked set under it after closing was
	// set, so a key is either taken before that check looks or refused.
	if c.closing.Load() {
		return sk, nil, ErrClosed
	}
	it := c.parked[sk]
	if it == nil || it.p.state.Load() == stGone {
		return sk, nil, ErrNotParked
	}
	delete(c.parked, sk)
	c.moving.Add(1) // the caller's defer gives it back
	return sk, it, nil
}

// Resume runs a parked key's failed record again, with a fresh attempt
// budget. It returns ErrNotParked for a key not parked (or of a partition no
// longer owned), ErrClosed once Close has started, ErrZeroConsumer for a
// Consumer not made by NewConsumer. Only Topic, Partition and
// Key (Offset too under Unordered) of k are used.
func (c *Consumer) Resume(k ParkedKey) error {
	sk, _, err := c.takeParked(k)
	if err != nil {
		return err
	}
	defer c.moving.Add(-1)
	if err := c.sched.Resume(sk); err != nil {
		if errors.Is(err, keysched.ErrNotParked) {
			return ErrNotParked
		}
		return err
	}
	return nil
}

// Skip dead-letters a parked key's failed record (waiting for the produce's
// acknowledgement), which finishes it, and moves the key on to its next
// record. When the dead-letter produce fails the key stays parked and Skip
// returns the produce's error; when the key's partition is taken away
// (revoked, lost, Close giving up) while it waits for the produce, Skip
// returns an error wrapping ErrNotParked (the next owner handles the
// record). Errors otherwise as for Resume.
func (c *Consumer) Skip(k ParkedKey) error {
	sk, it, err := c.takeParked(k)
	if err != nil {
		return err
	}
	defer c.moving.Add(-1)
	p := it.p
	if !p.enter(false) {
		return ErrNotParked
	}
	var cause error
	if e := it.lastErr.Load(); e != nil {
		cause = *e
	}
	if err := c.produceDeadLetter(p.ctx, it, cause, false); err != nil {
		p.leave()
		if p.ctx.Err() != nil {
			// The partition was taken away (revoked, lost, or Close gave
			// up) while the dead letter was being written: the key is no
			// longer parked here (the next owner handles the record), and
			// putting it back would list it in Parked for a partition this
			// member no longer owns.
			return fmt.Errorf("%w: its partition was taken away before the dead letter was written (%w)", ErrNotParked, err)
		}
		c.parkMu.Lock()
		c.parked[sk] = it
		c.parkMu.Unlock()
		return fmt.Errorf("kafka: skip: dead letter not written, the key stays parked: %w", err)
	}
	it.finish()
	p.leave()
	p.mu.Lock()
	g := it.g
	p.mu.Unlock()
	g.handOn(g.cur + 1) // the group's later records, before the key moves on
	if err := c.sched.Skip(sk); err != nil && !errors.Is(err, keysched.ErrNotParked) {
		return err
	}
	return nil
}
