package kafka

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A handler's keysched.Snooze is not an attempt (see keysched.Snooze): a
// record that snoozes 3 times, then fails twice on a 2-attempt policy, is
// dead-lettered with HeaderAttempts "2", and a parked record's
// ParkedKey.Attempts is its failed attempts only. Before the fix the
// adapter counted every handler call, snoozed ones too ("5", 4).
func TestSnoozedRecordIsNotAnAttempt(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	tc.produce(t, rec("t", 0, "a", "a0"), rec("t", 0, "a", "a1"), rec("t", 0, "b", "b0"))
	var calls [2]atomic.Int32 // a0, b0
	busy := errors.New("busy")
	h := func(ctx context.Context, r *kgo.Record) error {
		var n int32
		switch string(r.Value) {
		case "a0":
			n = calls[0].Add(1)
		case "b0":
			n = calls[1].Add(1)
		default:
			return nil
		}
		if n <= 3 {
			return keysched.Snooze(busy, time.Millisecond)
		}
		return errors.New("fails " + string(r.Value))
	}
	c := startConsumer(t, h, WithLogger(quiet), WithDeadLetterTopic("dlq"), WithCommitInterval(5*time.Millisecond),
		WithSchedulerOptions(keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	d := tc.readAll(t, "dlq", 2)
	for _, r := range d {
		if n, _ := header(r, HeaderAttempts); n != "2" {
			t.Errorf("dead letter of %s: %s=%s, want 2 (3 snoozes and 2 failed attempts)", r.Value, HeaderAttempts, n)
		}
	}
	if a, b := calls[0].Load(), calls[1].Load(); a != 5 || b != 5 {
		t.Errorf("handler calls a0=%d b0=%d, want 5 each (a snooze spends no attempt)", a, b)
	}
	_ = c
}

func TestSnoozedRecordParkedAttempts(t *testing.T) {
	tc := newCluster(t, 1, "t")
	tc.produce(t, rec("t", 0, "a", "a0"))
	var calls atomic.Int32
	h := func(ctx context.Context, r *kgo.Record) error {
		if calls.Add(1) <= 3 {
			return keysched.Snooze(errors.New("busy"), time.Millisecond)
		}
		return errors.New("fails")
	}
	c := startConsumer(t, h, WithLogger(quiet), WithCommitInterval(5*time.Millisecond),
		WithSchedulerOptions(keysched.WithFailurePolicy(keysched.Park)),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "a parked", func() bool { return len(c.Parked()) == 1 })
	if k := c.Parked()[0]; k.Attempts != 1 {
		t.Errorf("parked a0: Attempts %d, want 1 (3 snoozes are not attempts)", k.Attempts)
	}
}

// The same within a group: x0 fails once then succeeds, so x1's snooze in
// the same group is handed on to a group of its own (its error stashed);
// x1 then snoozes again and fails twice: its dead letter counts 2 attempts.
func TestSnoozedRecordHandedOnInAGroup(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	tc.produce(t, rec("t", 0, "x", "x0"), rec("t", 0, "x", "x1"))
	var x0, x1 atomic.Int32
	h := func(ctx context.Context, r *kgo.Record) error {
		switch string(r.Value) {
		case "x0":
			if x0.Add(1) == 1 {
				return errors.New("fails once")
			}
			return nil
		default:
			if x1.Add(1) <= 2 {
				return keysched.Snooze(errors.New("busy"), time.Millisecond)
			}
			return errors.New("fails x1")
		}
	}
	startConsumer(t, h, WithLogger(quiet), WithDeadLetterTopic("dlq"), WithCommitInterval(5*time.Millisecond),
		WithSchedulerOptions(keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	d := tc.readAll(t, "dlq", 1)[0]
	if n, _ := header(d, HeaderAttempts); n != "2" || string(d.Value) != "x1" {
		t.Errorf("dead letter of %s: %s=%s, want x1 with 2", d.Value, HeaderAttempts, n)
	}
	if n := x1.Load(); n != 4 {
		t.Errorf("x1's handler ran %d times, want 4 (2 snoozes, 2 attempts)", n)
	}
}
