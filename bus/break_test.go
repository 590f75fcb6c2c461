package bus

// Regression tests from an adversarial review (branch break).

import (
	"context"
	"errors"
	"testing"

	"github.com/keysched/keysched"
	"github.com/stretchr/testify/require"
)

type ctxTag struct{}

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
