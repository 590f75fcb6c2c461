package bus

import (
	"context"
	"errors"
	"fmt"
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
