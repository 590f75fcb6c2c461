package keysched

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var runtimeGosched = runtime.Gosched

type ctxKey string

// The task's context keeps Submit's values but not its cancellation,
// deadline or cause; it is cancelled when the attempt returns.
func TestTaskContextSemantics(t *testing.T) {
	s := newSched[int](t)
	ctx := watchdog(t)
	cause := errors.New("the request is gone")
	parent, cancel := context.WithCancelCause(context.WithValue(ctx, ctxKey("trace"), "abc123"))
	parent, cancelTimeout := context.WithTimeout(parent, time.Hour)
	defer cancelTimeout()
	var kept context.Context
	gate := make(chan struct{})
	c, err := s.Submit(parent, 1, func(tctx context.Context) error {
		<-gate
		kept = tctx
		require.Equal(t, "abc123", tctx.Value(ctxKey("trace")))
		require.NoError(t, tctx.Err(), "Submit's context ending must not cancel the task")
		_, hasDeadline := tctx.Deadline()
		require.False(t, hasDeadline)
		require.Nil(t, context.Cause(tctx))
		select {
		case <-tctx.Done():
			t.Error("task context done while running")
		default:
		}
		// A context derived from the task's is cancelled with it.
		child, stop := context.WithCancel(tctx)
		defer stop()
		require.NoError(t, child.Err())
		require.Equal(t, 1, Attempt(child))
		return nil
	})
	require.NoError(t, err)
	cancel(cause)
	close(gate)
	require.NoError(t, c.Wait(ctx))
	require.ErrorIs(t, kept.Err(), context.Canceled, "cancelled once the attempt returned")
	<-kept.Done()
	require.ErrorIs(t, context.Cause(kept), context.Canceled, "not Submit's cause")
	require.Zero(t, Attempt(ctx))
	require.Zero(t, Attempt(nil)) //nolint:staticcheck
}

// Cancel on a running task cancels its context; its outcome is what it
// returns, counted as cancelled.
func TestCancelRunningTask(t *testing.T) {
	s := newSched[int](t)
	ctx := watchdog(t)
	started := make(chan struct{})
	c, err := s.Submit(ctx, 1, func(tctx context.Context) error {
		close(started)
		<-tctx.Done()
		return tctx.Err()
	})
	require.NoError(t, err)
	next, err := s.Submit(ctx, 1, func(context.Context) error { return nil })
	require.NoError(t, err)
	<-started
	c.Cancel()
	require.ErrorIs(t, c.Wait(ctx), context.Canceled)
	require.NoError(t, next.Wait(ctx))
	c.Cancel() // on a done task: nothing
	require.NoError(t, s.Drain(ctx))
	st := s.Stats()
	require.EqualValues(t, 1, st.Cancelled)
	require.EqualValues(t, 1, st.Succeeded)
	// A cancelled queued task never runs, and its key goes on.
	gate := make(chan struct{})
	_, err = s.Submit(ctx, 2, func(context.Context) error { <-gate; return nil })
	require.NoError(t, err)
	ran := false
	q, err := s.Submit(ctx, 2, func(context.Context) error { ran = true; return nil })
	require.NoError(t, err)
	after, err := s.Submit(ctx, 2, func(context.Context) error { return nil })
	require.NoError(t, err)
	q.Cancel()
	require.ErrorIs(t, q.Err(), context.Canceled, "done at once")
	close(gate)
	require.NoError(t, after.Wait(ctx))
	require.False(t, ran)
	require.NoError(t, s.Drain(ctx))
	assertAccounting(t, s.Stats())
}

// Submissions with a task's context never wait: a full key or scheduler
// fails at once. Drain and Close with it would wait for the calling task.
func TestInsideTaskNeverWaits(t *testing.T) {
	s := newSched[string](t, WithWorkers(1), WithMaxKeyDepth(2), WithMaxPending(3))
	ctx := watchdog(t)
	done := make(chan struct{})
	_, err := s.Submit(ctx, "k", func(tctx context.Context) error {
		defer close(done)
		// Own key: this task plus one queued fill it.
		_, err := s.Submit(tctx, "k", func(context.Context) error { return nil })
		require.NoError(t, err)
		_, err = s.Submit(tctx, "k", func(context.Context) error { return nil })
		require.ErrorIs(t, err, ErrKeyFull)
		// A derived context is still the task's.
		derived, cancel := context.WithTimeout(tctx, time.Hour)
		defer cancel()
		_, err = s.Submit(derived, "k", func(context.Context) error { return nil })
		require.ErrorIs(t, err, ErrKeyFull)
		// The pending bound: 2 pending now, one more fits, then full.
		_, err = s.Submit(tctx, "other", func(context.Context) error { return nil })
		require.NoError(t, err)
		_, err = s.Submit(tctx, "third", func(context.Context) error { return nil })
		require.ErrorIs(t, err, ErrFull)
		require.ErrorIs(t, s.Drain(tctx), ErrInsideTask)
		require.ErrorIs(t, s.Close(tctx), ErrInsideTask)
		return nil
	})
	require.NoError(t, err)
	<-done
	require.NoError(t, s.Drain(ctx))
}

// Submit waiting for room returns once ctx ends, with both reasons, and
// enqueues nothing; it succeeds when room appears.
func TestSubmitWaitsForRoom(t *testing.T) {
	s := newSched[int](t, WithMaxKeyDepth(1), WithMaxPending(2))
	ctx := watchdog(t)
	gate := make(chan struct{})
	_, err := s.Submit(ctx, 1, func(context.Context) error { <-gate; return nil })
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	defer cancel()
	_, err = s.Submit(short, 1, func(context.Context) error { return nil })
	require.ErrorIs(t, err, ErrKeyFull)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, 1, s.KeyDepth(1))

	_, err = s.Submit(ctx, 2, func(context.Context) error { <-gate; return nil })
	require.NoError(t, err)
	short2, cancel2 := context.WithTimeout(ctx, 5*time.Millisecond)
	defer cancel2()
	_, err = s.Submit(short2, 3, func(context.Context) error { return nil })
	require.ErrorIs(t, err, ErrFull)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// Waiting submitters are woken by the completions that make room.
	res := make(chan error, 2)
	go func() { _, err := s.Submit(ctx, 1, func(context.Context) error { return nil }); res <- err }()
	go func() { _, err := s.Submit(ctx, 3, func(context.Context) error { return nil }); res <- err }()
	close(gate)
	require.NoError(t, <-res)
	require.NoError(t, <-res)
	require.NoError(t, s.Drain(ctx))
	require.EqualValues(t, 4, s.Stats().Succeeded)
	require.EqualValues(t, 2, s.Stats().Rejected)
}

// Close wakes submitters waiting for room with ErrClosed; concurrent Close
// calls all return the first's result.
func TestCloseWakesWaitersAndIsIdempotent(t *testing.T) {
	s, err := New[int](WithMaxKeyDepth(1), WithLogger(quiet))
	require.NoError(t, err)
	ctx := watchdog(t)
	gate := make(chan struct{})
	_, err = s.Submit(ctx, 1, func(context.Context) error { <-gate; return nil })
	require.NoError(t, err)
	waiting := make(chan error)
	go func() { _, err := s.Submit(ctx, 1, func(context.Context) error { return nil }); waiting <- err }()
	for s.core.rejected.Load() == 0 && !s.hasKeyWaiters(1) {
		runtime.Gosched()
	}
	closed := make(chan error, 3)
	for range 3 {
		go func() { closed <- s.Close(ctx) }()
	}
	require.ErrorIs(t, <-waiting, ErrClosed)
	close(gate)
	for range 3 {
		require.NoError(t, <-closed)
	}
}

func (s *Scheduler[K]) hasKeyWaiters(key K) bool {
	ch, ok := s.tails.load(key)
	return ok && ch.waiters.Load() > 0
}
