package bus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/stretchr/testify/require"
)

// Issue 8, class 4 through the bus: with a subscriber whose dead-letter
// function is blocked, Close still returns once it gives up (within
// keysched.CloseGrace), reports what is left in each subscriber's
// *keysched.CloseError, and delivers the rest afterwards. Then SubStats is
// settled (class 3).
func TestCloseReturnsWithDeadLettersUndelivered(t *testing.T) {
	ctx := guardCtx(t)
	b, err := New[int](WithWorkers(4), WithLogger(quiet))
	require.NoError(t, err)
	released, release := gate(t)
	dlGate, dlRelease := gate(t)
	var letters atomic.Int64
	started := make(chan struct{}, 4)
	sub, err := Subscribe(b, "s", func(ctx context.Context, env Envelope[int], ev tick) error {
		started <- struct{}{}
		<-released // ignores its context
		return nil
	}, MaxPending(20_000), DeadLetters(func(DeadLetter[int]) { <-dlGate; letters.Add(1) }))
	require.NoError(t, err)
	const events = 10_000
	for i := range events {
		require.NoError(t, b.Publish(ctx, i%100, tick{i}))
	}
	for range 4 { // every worker is busy before Close begins
		recv(t, started, "a handler")
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	err = b.Close(cctx)
	require.ErrorIs(t, err, keysched.ErrAborted)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var ce *keysched.CloseError
	require.True(t, errors.As(err, &ce), "%v", err)
	require.Equal(t, 4, ce.Running, "%+v", ce)
	require.GreaterOrEqual(t, ce.Undelivered, 1, "%+v", ce)
	require.Zero(t, letters.Load())

	dlRelease()
	release()
	require.Eventually(t, func() bool { // delivered in the background
		st := sub.Stats()
		return st.Pending == 0 && int(st.Succeeded+st.Aborted) == events
	}, guard, time.Millisecond, "%+v", fmt.Sprint(sub.Stats()))
	st := sub.Stats()
	require.Zero(t, st.Keys, "%+v", st)
	require.EqualValues(t, 4, st.Succeeded, "%+v", st)
	require.EqualValues(t, events-4, st.Aborted, "%+v", st)
	require.EqualValues(t, events-4, letters.Load())
	require.EqualValues(t, st.Aborted, st.DeadLettered, "%+v", st)
}

// After a Close that gave up, Bus.Drain waits for what Close left in the
// background: the handlers still running and every dead letter (before, it
// returned at once: Close had removed the subscribers Drain walks).
func TestDrainAfterCloseWaitsForBackground(t *testing.T) {
	ctx := guardCtx(t)
	b, err := New[int](WithWorkers(2), WithLogger(quiet))
	require.NoError(t, err)
	released, release := gate(t)
	dlGate, dlRelease := gate(t)
	var letters atomic.Int64
	started := make(chan struct{}, 2)
	_, err = Subscribe(b, "s", func(ctx context.Context, env Envelope[int], ev tick) error {
		started <- struct{}{}
		<-released // ignores its context
		return nil
	}, DeadLetters(func(DeadLetter[int]) { <-dlGate; letters.Add(1) }))
	require.NoError(t, err)
	const events = 50
	for i := range events {
		require.NoError(t, b.Publish(ctx, i%10, tick{i}))
	}
	for range 2 {
		recv(t, started, "a handler")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, b.Close(cctx), keysched.ErrAborted)
	require.Error(t, b.Drain(cctx), "an ended context: unfinished work is reported")

	drained := make(chan error, 1)
	go func() { drained <- b.Drain(ctx) }()
	dlRelease()
	release()
	require.NoError(t, <-drained)
	require.EqualValues(t, events-2, letters.Load(), "every aborted event's letter was delivered before Drain returned")
	require.NoError(t, b.Drain(ctx), "nothing left: at once")
}

type ctxTag struct{}

// Found by attacking the code (adversarial review, first a failing reproducer).
//
// A dead-letter function had no context of its own: Close, Drain or
// Unsubscribe called from it with any context waited for the dead letter
// being delivered, that is for the function itself (Close with
// context.Background() hung for ever, the function's worker with it). Now
// DeadLetter.Context counts as a handler's: those calls return
// keysched.ErrInsideTask at once, a Publish with it never waits for room,
// and it carries the publisher's values.
func TestDeadLetterContextIsInside(t *testing.T) {
	ctx := context.WithValue(guardCtx(t), ctxTag{}, "trace-7")
	b := newBus[string](t, WithWorkers(2))
	held, release := gate(t)
	// A Block subscriber whose key "full" is full: a Publish from the dead
	// letter function must refuse at once, not wait.
	_, err := Subscribe(b, "slow", func(context.Context, Envelope[string], tick) error { <-held; return nil },
		MaxKeyDepth(1))
	require.NoError(t, err)
	type result struct {
		tag                        any
		closeE, drainE, unsubE, pE error
	}
	got := make(chan result, 1)
	var sub *Subscription[string]
	sub, err = Subscribe(b, "failing", func(context.Context, Envelope[string], order) error {
		return keysched.Permanent(errors.New("bad order"))
	}, DeadLetters(func(dl DeadLetter[string]) {
		got <- result{
			tag:    dl.Context.Value(ctxTag{}),
			closeE: b.Close(dl.Context),
			drainE: b.Drain(dl.Context),
			unsubE: sub.Unsubscribe(dl.Context),
			pE:     b.Publish(dl.Context, "full", tick{2}),
		}
	}))
	require.NoError(t, err)
	require.NoError(t, b.Publish(ctx, "full", tick{1})) // the slow subscriber's key is full now
	require.NoError(t, b.Publish(ctx, "o", order{ID: "x"}))
	r := recv(t, got, "the dead letter")
	require.Equal(t, "trace-7", r.tag)
	require.ErrorIs(t, r.closeE, keysched.ErrInsideTask)
	require.ErrorIs(t, r.drainE, keysched.ErrInsideTask)
	require.ErrorIs(t, r.unsubE, keysched.ErrInsideTask)
	require.ErrorIs(t, r.pE, keysched.ErrKeyFull)
	release()
	require.NoError(t, b.Drain(ctx))
	// Nothing was closed by those calls.
	require.NoError(t, b.Publish(ctx, "o", order{ID: "y"}))
	require.NoError(t, b.Close(ctx))
}

// Found by attacking the code (adversarial review, first a failing reproducer).
//
// The dead letter of an event Close gave up on (it never ran: Attempt is 0,
// which the bus took for "not a handler"): Close from its dead-letter
// function waited for the Close in progress, which waited for that function.
func TestCloseFromAbortedDeadLetter(t *testing.T) {
	ctx := guardCtx(t)
	b, err := New[string](WithWorkers(1), WithLogger(quiet))
	require.NoError(t, err)
	running := make(chan struct{}, 1)
	inner := make(chan error, 1)
	_, err = Subscribe(b, "s", func(hctx context.Context, _ Envelope[string], ev tick) error {
		if ev.N == 0 {
			running <- struct{}{}
			<-hctx.Done() // until Close cancels it
		}
		return nil
	}, DeadLetters(func(dl DeadLetter[string]) {
		if dl.Attempts == 0 && errors.Is(dl.Err, keysched.ErrAborted) {
			select {
			case inner <- b.Close(dl.Context):
			default:
			}
		}
	}))
	require.NoError(t, err)
	require.NoError(t, b.Publish(ctx, "k", tick{0}))
	require.NoError(t, b.Publish(ctx, "k", tick{1})) // queued behind 0: aborted
	recv(t, running, "the first handler")
	gaveUp, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, b.Close(gaveUp), keysched.ErrAborted)
	require.ErrorIs(t, recv(t, inner, "the inner Close"), keysched.ErrInsideTask)
}

// Found by attacking the code (adversarial review, first a failing reproducer).
//
// Publishers racing Close (and an Unsubscribe): every Publish that returned
// nil had its event handled or dead-lettered, exactly once, by every
// subscriber that was not unsubscribed; every other Publish says ErrClosed.
// (Passed: no finding; kept as a guard.)
func TestPublishRacingClose(t *testing.T) {
	for round := range 5 {
		b, err := New[int](WithWorkers(4), WithLogger(quiet))
		require.NoError(t, err)
		var mu sync.Mutex
		seen := map[string]map[int]int{"a": {}, "b": {}}
		mark := func(name string, n int) {
			mu.Lock()
			seen[name][n]++
			mu.Unlock()
		}
		for _, name := range []string{"a", "b"} {
			_, err := Subscribe(b, name, func(_ context.Context, _ Envelope[int], ev tick) error {
				mark(name, ev.N)
				return nil
			}, MaxPending(100_000), DeadLetters(func(dl DeadLetter[int]) { mark(name, dl.Envelope.Event.(tick).N) }))
			require.NoError(t, err)
		}
		gone, err := Subscribe(b, "gone", func(context.Context, Envelope[int], tick) error { return nil })
		require.NoError(t, err)
		var wg sync.WaitGroup
		accepted := make(chan int, 10_000)
		start := make(chan struct{})
		under := make(chan struct{}, 4) // a publisher is well under way
		for p := range 4 {
			wg.Go(func() {
				<-start
				for i := range 500 {
					n := p*1000 + i
					if i == 100 {
						under <- struct{}{}
					}
					err := b.Publish(context.Background(), n%7, tick{n})
					if err == nil {
						accepted <- n
						continue
					}
					if !errors.Is(err, ErrClosed) {
						t.Errorf("publish %d: %v", n, err)
					}
				}
			})
		}
		close(start)
		recv(t, under, "a publisher's 100th event")
		wg.Go(func() { _ = gone.Unsubscribe(context.Background()) })
		cctx, cancel := context.WithCancel(context.Background())
		if round%2 == 1 {
			cancel() // give up at once: queued events are dead-lettered
		}
		closeErr := b.Close(cctx)
		cancel()
		wg.Wait()
		close(accepted)
		if round%2 == 0 {
			require.NoError(t, closeErr)
		}
		var ns []int
		for n := range accepted {
			ns = append(ns, n)
		}
		// Dead letters Close did not deliver within its grace are delivered
		// in the background: wait for them (never more than once each).
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, n := range ns {
				for _, name := range []string{"a", "b"} {
					if c := seen[name][n]; c > 1 {
						t.Fatalf("round %d: subscriber %s handled event %d %d times", round, name, n, c)
					} else if c == 0 {
						return false
					}
				}
			}
			return true
		}, guard, time.Millisecond, "round %d: every accepted event handled or dead-lettered", round)
		t.Logf("round %d: %d events accepted before Close", round, len(ns))
	}
}
