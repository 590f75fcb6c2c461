package kafka

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Close does not wait for parked keys: once it has started nothing can
// resume or skip them (Resume and Skip return ErrClosed), so a Close whose
// context never ends waited for ever. It drains the other keys, leaves the
// parked records unfinished (the frontier stays below them), says so with
// ErrLeftParked, and the next owner handles them, in order.
func TestCloseDoesNotWaitForParkedKeys(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	tc.produce(t, rec("t", 0, "a", "a0"), rec("t", 0, "a", "a1"), rec("t", 0, "b", "b0"), rec("t", 0, "b", "b1"))
	group := groupName(t)
	var mu sync.Mutex
	var seen []string
	has := func(v string) bool { mu.Lock(); defer mu.Unlock(); return slices.Contains(seen, v) }
	h := func(ctx context.Context, r *kgo.Record) error {
		if string(r.Value) == "a0" {
			return keysched.Permanent(errors.New("refused"))
		}
		mu.Lock()
		seen = append(seen, string(r.Value))
		mu.Unlock()
		return nil
	}
	c, err := NewConsumer(h, WithLogger(quiet), WithDeadLetterTopic("dlq"),
		WithSchedulerOptions(keysched.WithFailurePolicy(keysched.Park)),
		WithClientOptions(tc.clientOpts(group, "t")...))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	eventually(t, "a parked, b handled", func() bool { return len(c.Parked()) == 1 && has("b1") })

	closed := make(chan error, 1)
	go func() { closed <- c.Close(context.Background()) }()
	select {
	case err = <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("Close(context.Background()) still waits 20 s after a key parked: it waits for the parked key for ever")
	}
	if err := <-ran; err != nil {
		t.Errorf("Run: %v", err)
	}
	if !errors.Is(err, ErrLeftParked) || errors.Is(err, ErrNotCommitted) {
		t.Fatalf("Close: %v; want ErrLeftParked and the frontier committed", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "2 records") || !strings.Contains(msg, "1 parked key") {
		t.Errorf("Close's error %q does not count the 2 records of the 1 parked key", msg)
	}
	if got := tc.committedOffset(t, group, "t", 0); got != 0 {
		t.Fatalf("committed %d past the parked record at offset 0", got)
	}
	if has("a1") {
		t.Fatal("the parked key's next record ran")
	}
	if n := tc.endOffset(t, "dlq", 0); n != 0 {
		t.Errorf("Close wrote %d dead letters for a parked key; only Skip does", n)
	}

	// The next owner handles the parked key's records, in order.
	var mu2 sync.Mutex
	var again []string
	startConsumer(t, func(ctx context.Context, r *kgo.Record) error {
		mu2.Lock()
		again = append(again, string(r.Value))
		mu2.Unlock()
		return nil
	}, WithLogger(quiet), WithClientOptions(tc.clientOpts(group, "t")...))
	eventually(t, "the next owner handled a0 and a1", func() bool { mu2.Lock(); defer mu2.Unlock(); return len(again) >= 2 })
	mu2.Lock()
	defer mu2.Unlock()
	if !slices.Equal(again[:2], []string{"a0", "a1"}) {
		t.Errorf("the next owner handled %v first; want a0, a1", again)
	}
}
