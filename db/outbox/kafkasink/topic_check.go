package kafkasink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keysched/keysched/db/outbox"
)

// ErrUnknownTopic is wrapped by the sink's error for an event whose topic
// the cluster does not have (Kafka's UNKNOWN_TOPIC_OR_PARTITION): a valid
// name that no one created, such as a typo. The error names the topic and
// the event. It is retryable (a topic created meanwhile is found by the
// next call): the relay's retry policy then marks the row dead with it.
var ErrUnknownTopic = errors.New("kafkasink: unknown topic")

// How the sink asks again about a topic the cluster does not know: a topic
// created just before may not have reached every broker's metadata yet.
// As the Kafka consumer's check of its dead-letter topic.
const (
	topicCheckTries = 5
	topicCheckGap   = 250 * time.Millisecond
)

// topicCheck remembers the topics the cluster was seen to have, so that
// each is asked about once (a produce to a topic the cluster lacks would
// wait for metadata until the call's context ends, then fail with a bare
// context error). Concurrent first calls for one topic share one check:
// the cluster gets one metadata request at a time per topic, not one per
// key. The set holds the topics the cluster was seen to have: it is
// bounded by the cluster's topics. Safe for concurrent use.
type topicCheck struct {
	cl    *kgo.Client
	auto  bool     // kgo.AllowAutoTopicCreation: the produce creates it
	known sync.Map // topic -> struct{}

	mu     sync.Mutex
	asking map[string]*topicAsk // the check in progress per topic
}

// topicAsk is one check of a topic, shared by the calls that wait for it.
type topicAsk struct {
	done  chan struct{} // closed when err, tries and when are set
	err   error         // the broker's UNKNOWN_TOPIC_OR_PARTITION; nil: present or cannot tell
	tries int
	when  string
	cut   bool // the asking call's context ended: the waiters ask again

	// The answers so far, for a waiting call whose context ends first.
	mu       sync.Mutex
	unknowns int   // requests answered UNKNOWN_TOPIC_OR_PARTITION
	last     error // the last of those answers
}

// progress records one more UNKNOWN_TOPIC_OR_PARTITION answer.
func (a *topicAsk) progress(err error) {
	a.mu.Lock()
	a.unknowns++
	a.last = err
	a.mu.Unlock()
}

func newTopicCheck(cl *kgo.Client) *topicCheck {
	auto, _ := cl.OptValue(kgo.AllowAutoTopicCreation).(bool)
	return &topicCheck{cl: cl, auto: auto, asking: map[string]*topicAsk{}}
}

// check returns an error wrapping ErrUnknownTopic when the cluster still
// does not have topic after topicCheckTries metadata requests
// topicCheckGap apart, or when ctx ends between two of them, and nil
// otherwise: the topic present (remembered), auto topic creation allowed,
// or the check unable to tell (no answer, another refusal, ctx ended
// during a request: the produce then says the rest). A call that finds a
// check of topic in progress (another key's) waits for its answer; when
// that check was cut short by its own call's context, the waiting call
// checks again with its own context. When ctx ends while it waits, its
// error says the check was pending and wraps ctx's error, and also
// ErrUnknownTopic once the cluster answered that it lacks the topic.
func (c *topicCheck) check(ctx context.Context, topic string, e outbox.Event) error {
	if c.auto {
		return nil
	}
	for {
		if _, ok := c.known.Load(topic); ok {
			return nil
		}
		c.mu.Lock()
		a, waiting := c.asking[topic]
		if !waiting {
			a = &topicAsk{done: make(chan struct{})}
			c.asking[topic] = a
		}
		c.mu.Unlock()
		if waiting {
			select {
			case <-a.done:
			case <-ctx.Done():
				return a.pending(ctx, topic, e)
			}
			if a.cut {
				// The other call's context ended before its tries did:
				// this call asks with its own.
				continue
			}
		} else {
			a.tries, a.when, a.err = c.ask(ctx, topic, a)
			a.cut = ctx.Err() != nil
			c.mu.Lock()
			delete(c.asking, topic)
			c.mu.Unlock()
			close(a.done)
		}
		if a.err == nil {
			return nil
		}
		return fmt.Errorf("%w: produce event %s (key %q, seq %d) to topic %q: the cluster does not have the topic (%w; asked %d times, %s): create it, or allow auto topic creation (kgo.AllowAutoTopicCreation)",
			ErrUnknownTopic, e.ID, e.Key, e.Seq, topic, a.err, a.tries, a.when)
	}
}

// pending is the error of a call whose ctx ended while it waited for
// another call's check a of topic.
func (a *topicAsk) pending(ctx context.Context, topic string, e outbox.Event) error {
	a.mu.Lock()
	unknowns, last := a.unknowns, a.last
	a.mu.Unlock()
	if last != nil {
		return fmt.Errorf("%w: produce event %s (key %q, seq %d) to topic %q: the cluster does not have the topic (%w; asked %d times by another key's call, whose check was still pending when this call's context ended: %w): create it, or allow auto topic creation (kgo.AllowAutoTopicCreation)",
			ErrUnknownTopic, e.ID, e.Key, e.Seq, topic, last, unknowns, ctx.Err())
	}
	return fmt.Errorf("kafkasink: produce event %s (key %q, seq %d) to topic %q: the call's context ended while another key's check of the topic was pending (no answer from the cluster yet): %w",
		e.ID, e.Key, e.Seq, topic, ctx.Err())
}

// ask asks the cluster about topic up to topicCheckTries times, and returns
// the broker's UNKNOWN_TOPIC_OR_PARTITION with the number of requests and
// how long they went on when it never had the topic; a nil error when it
// has it or the answer cannot tell. Each such answer is recorded in a.
func (c *topicCheck) ask(ctx context.Context, topic string, a *topicAsk) (tries int, when string, _ error) {
	for try := 1; ; try++ {
		err := c.unknown(ctx, topic)
		if err == nil {
			return try, "", nil
		}
		a.progress(err)
		if try == topicCheckTries {
			return try, fmt.Sprintf("over %v", time.Duration(topicCheckTries-1)*topicCheckGap), err
		}
		t := time.NewTimer(topicCheckGap)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			// The call's context ended while the cluster said it does not
			// have the topic: that, not the context, is the news.
			return try, fmt.Sprintf("until the call's context ended: %v", ctx.Err()), err
		}
	}
}

// unknown asks the cluster once for topic's metadata, without creating it,
// and returns the broker's error when it answered
// UNKNOWN_TOPIC_OR_PARTITION for it; nil when it has the topic (remembered)
// or the answer cannot tell (no answer, another refusal).
func (c *topicCheck) unknown(ctx context.Context, topic string) error {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = false
	resp, reqErr := req.RequestWith(ctx, c.cl)
	var topics []kmsg.MetadataResponseTopic
	if reqErr == nil { // no answer: the produce says the rest
		topics = resp.Topics
	}
	for _, t := range topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		err := kerr.ErrorForCode(t.ErrorCode)
		switch {
		case err == nil:
			c.known.Store(topic, struct{}{})
		case errors.Is(err, kerr.UnknownTopicOrPartition):
			return err
		}
		return nil
	}
	return nil
}
