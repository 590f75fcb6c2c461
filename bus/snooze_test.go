package bus

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/stretchr/testify/require"
)

// A handler's keysched.Snooze reaches the subscriber's scheduler untouched:
// the event runs again without spending an attempt, so its dead letter's
// Attempts counts the failed attempts only (MaxAttempts 1 here: the 3
// snoozes before the failure do not spend it).
func TestHandlerSnoozeIsNotAnAttempt(t *testing.T) {
	ctx := guardCtx(t)
	b, err := New[int](WithLogger(quiet))
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	var runs atomic.Int32
	letters := make(chan DeadLetter[int], 1)
	fail := errors.New("fail")
	sub, err := Subscribe(b, "s", func(ctx context.Context, env Envelope[int], ev tick) error {
		if runs.Add(1) <= 3 {
			return keysched.Snooze(errors.New("busy"), time.Millisecond)
		}
		return fail
	}, DeadLetters(func(dl DeadLetter[int]) { letters <- dl }))
	require.NoError(t, err)
	require.NoError(t, b.Publish(ctx, 1, tick{1}))
	require.NoError(t, b.Drain(ctx))
	dl := recv(t, letters, "the dead letter")
	require.ErrorIs(t, dl.Err, fail)
	require.Equal(t, 1, dl.Attempts)
	require.EqualValues(t, 4, runs.Load())
	st := sub.Stats()
	require.EqualValues(t, 3, st.Snoozed)
	require.EqualValues(t, 1, st.Failed)
}

// An Unsubscribe that gave up leaves its handler and dead letters in the
// background; the bus's Drain waits for them, and a second Unsubscribe
// racing it returns the first one's result.
func TestDrainAfterUnsubscribeGaveUp(t *testing.T) {
	ctx := guardCtx(t)
	b, err := New[int](WithWorkers(2), WithLogger(quiet))
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	released, release := gate(t)
	dlGate, dlRelease := gate(t)
	var letters atomic.Int64
	started := make(chan struct{}, 1)
	sub, err := Subscribe(b, "s", func(ctx context.Context, env Envelope[int], ev tick) error {
		if ev.N == 0 {
			started <- struct{}{}
			<-released // ignores its context
			return nil
		}
		return keysched.Snooze(errors.New("busy"), time.Hour)
	}, DeadLetters(func(DeadLetter[int]) { <-dlGate; letters.Add(1) }))
	require.NoError(t, err)
	const events = 20
	for i := range events {
		require.NoError(t, b.Publish(ctx, i%2, tick{i}))
	}
	recv(t, started, "the stuck handler")
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, sub.Unsubscribe(cctx), keysched.ErrAborted)
	require.Error(t, b.Drain(cctx))
	drained := make(chan error, 1)
	go func() { drained <- b.Drain(ctx) }()
	require.ErrorIs(t, sub.Unsubscribe(ctx), keysched.ErrAborted, "a second Unsubscribe: the first's result")
	dlRelease()
	release()
	require.NoError(t, <-drained)
	require.EqualValues(t, events-1, letters.Load(), "every aborted event's letter (snoozing or queued) was delivered before Drain returned")
}

// A Close after an Unsubscribe that gave up waits, as Drain does, for what
// the Unsubscribe left in the background (its dead letters): before, it
// returned nil at once, even with an ended context, so a process that closed
// the bus and exited lost those letters without any error saying so.
func TestCloseAfterUnsubscribeGaveUpWaitsForBackground(t *testing.T) {
	for _, ended := range []bool{true, false} {
		ctx := guardCtx(t)
		b, err := New[int](WithWorkers(2), WithLogger(quiet))
		require.NoError(t, err)
		dlGate, dlRelease := gate(t)
		var letters atomic.Int64
		started := make(chan struct{}, 1)
		released, release := gate(t)
		sub, err := Subscribe(b, "s", func(ctx context.Context, env Envelope[int], ev tick) error {
			started <- struct{}{}
			<-released
			return nil
		}, DeadLetters(func(DeadLetter[int]) { <-dlGate; letters.Add(1) }))
		require.NoError(t, err)
		const events = 10
		for i := range events {
			require.NoError(t, b.Publish(ctx, 0, tick{i}))
		}
		recv(t, started, "the first handler")
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		require.ErrorIs(t, sub.Unsubscribe(cctx), keysched.ErrAborted)
		release()
		if ended {
			// The letters are held: a Close with an ended context says so.
			err := b.Close(cctx)
			require.ErrorIs(t, err, context.Canceled)
			require.ErrorContains(t, err, `unsubscribed subscriber "s"`)
			drained := make(chan error, 1)
			go func() { drained <- b.Drain(ctx) }()
			dlRelease()
			require.NoError(t, <-drained)
		} else {
			// A Close with a live context returns once they are delivered.
			closed := make(chan error, 1)
			go func() { closed <- b.Close(ctx) }()
			dlRelease()
			require.NoError(t, <-closed)
		}
		require.EqualValues(t, events-1, letters.Load(), "ended %v", ended)
	}
}
