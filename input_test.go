// Bad input and zero values: nil contexts, tasks and keys, keys that
// cannot be map keys, use after Close, zero Scheduler and Completion. (Bad
// options are options_test.go.)

package keysched

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/keysched/keysched/internal/zerotest"
	"github.com/panjf2000/ants/v2"
	"github.com/stretchr/testify/require"
)

// Written to attack the code (adversarial review, 2026-11-30) after a clean and
// an aborting Close; it held.
//
// Every call after Close returns an error (or a zero answer), never panics or
// hangs, whether Close finished cleanly or gave up.
func TestEveryCallAfterCloseErrsOrAnswersZero(t *testing.T) {
	for _, gaveUp := range []bool{false, true} {
		s, err := New[any](WithLogger(quiet), WithFailurePolicy(Park), WithMaxPending(math.MaxInt), WithMaxKeyDepth(math.MaxInt))
		require.NoError(t, err)
		ctx := watchdog(t)
		noop := func(context.Context) error { return nil }
		c, err := s.Submit(ctx, "k", noop)
		require.NoError(t, err)
		if gaveUp {
			_, err := s.Submit(ctx, "p", func(context.Context) error { return errors.New("park me") })
			require.NoError(t, err)
			require.NoError(t, c.Wait(ctx))
			for len(s.Parked()) == 0 {
				require.NoError(t, ctx.Err())
			}
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			require.ErrorIs(t, s.Close(cctx), ErrAborted)
		} else {
			require.NoError(t, s.Close(ctx))
		}
		_, err = s.Submit(ctx, "k", noop)
		require.ErrorIs(t, err, ErrClosed)
		_, err = s.TrySubmit(ctx, "k", noop)
		require.ErrorIs(t, err, ErrClosed)
		cs, err := s.SubmitBatch(ctx, []BatchItem[any]{{"k", noop}, {"j", noop}})
		require.ErrorIs(t, err, ErrClosed)
		require.Empty(t, cs)
		cs, err = s.TrySubmitBatch(ctx, []BatchItem[any]{{"k", noop}})
		require.ErrorIs(t, err, ErrClosed)
		require.Empty(t, cs)
		_, err = s.SubmitBatch(ctx, []BatchItem[any]{{[]int{1}, noop}})
		require.ErrorIs(t, err, ErrInvalidKey)
		_, err = s.Submit(ctx, math.NaN(), noop)
		require.ErrorIs(t, err, ErrInvalidKey)
		require.ErrorIs(t, s.Resume("p"), ErrClosed)
		require.ErrorIs(t, s.Skip("p"), ErrClosed)
		require.ErrorIs(t, s.Skip("never-submitted"), ErrClosed)
		require.ErrorIs(t, s.Resume([]int{1}), ErrInvalidKey)
		require.NoError(t, s.Drain(ctx))
		require.Equal(t, s.Close(ctx), s.Close(ctx))
		require.Empty(t, s.Keys(math.MaxInt))
		require.Empty(t, s.Keys(-1))
		require.Zero(t, s.KeyDepth([]int{1}))
		require.Zero(t, s.KeyAge([]int{1}))
		c.Cancel()
		require.NoError(t, c.Wait(ctx))
		st := s.Stats()
		assertAccounting(t, st)
		require.Zero(t, st.Keys)
		require.Zero(t, st.ParkedKeys)
	}
}

// Found by attacking the code (adversarial review, 2026-11-30): Cancel on a
// zero Completion dereferenced its nil chain header and panicked.
//
// A Completion the caller made itself (the zero value) is no task: Cancel
// must not panic and Wait must not hang.
func TestZeroCompletionCancelAndWait(t *testing.T) {
	var c Completion
	require.NotPanics(t, c.Cancel)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.Error(t, c.Wait(ctx))
}

// Found by attacking the code (adversarial review, 2026-12-02): Wait on a
// zero Completion with a context that never ends blocked for ever, Done
// never closed and Err said nil ("not done yet") for ever.
//
// A Completion the caller made itself (the zero value) answers as a nil one
// does: Wait and Err return ErrNilCompletion at once, Done is closed.
func TestZeroCompletionAnswersAsANilOne(t *testing.T) {
	var c Completion
	waited := make(chan error, 1)
	go func() { waited <- c.Wait(context.Background()) }()
	select {
	case err := <-waited:
		require.ErrorIs(t, err, ErrNilCompletion)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait on a zero Completion with a context that never ends blocked 10 s")
	}
	require.ErrorIs(t, c.Err(), ErrNilCompletion)
	select {
	case <-c.Done():
	default:
		t.Fatal("a zero Completion's Done channel is not closed")
	}
	var d Completion
	<-d.Done() // Done first, then Wait: the same answers
	require.ErrorIs(t, d.Wait(context.Background()), ErrNilCompletion)
}

// Found by attacking the code (adversarial review, 2026-11-30): Wait with a
// task's context walked the zero Completion's nil chain header and panicked.
//
// The same zero Completion waited on from inside a task (the deadlock check
// walks its chain: it has none).
func TestZeroCompletionWaitInsideTask(t *testing.T) {
	s := newSched[int](t)
	ctx := watchdog(t)
	c, err := s.Submit(ctx, 1, func(tctx context.Context) error {
		var z Completion
		wctx, cancel := context.WithCancel(tctx)
		cancel()
		if err := z.Wait(wctx); !errors.Is(err, ErrNilCompletion) {
			return fmt.Errorf("got %w, want ErrNilCompletion", err)
		}
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, c.Wait(ctx))
}

// A nil or zero-value Scheduler (not made by New) answers every method with
// ErrZeroScheduler or a zero value: no nil-pointer panic in the caller's
// goroutine (a newcomer's `var s keysched.Scheduler[string]` panicked in
// Submit before).
func TestZeroScheduler(t *testing.T) {
	ctx := context.Background()
	task := func(context.Context) error { return nil }
	for name, s := range map[string]*Scheduler[string]{"nil": nil, "zero value": new(Scheduler[string])} {
		t.Run(name, func(t *testing.T) {
			c, err := s.Submit(ctx, "k", task)
			require.ErrorIs(t, err, ErrZeroScheduler)
			require.Nil(t, c)
			c, err = s.TrySubmit(ctx, "k", task)
			require.ErrorIs(t, err, ErrZeroScheduler)
			require.Nil(t, c)
			cs, err := s.SubmitBatch(ctx, []BatchItem[string]{{Key: "k", Task: task}})
			require.ErrorIs(t, err, ErrZeroScheduler)
			require.Nil(t, cs)
			cs, err = s.TrySubmitBatch(ctx, []BatchItem[string]{{Key: "k", Task: task}})
			require.ErrorIs(t, err, ErrZeroScheduler)
			require.Nil(t, cs)
			require.ErrorIs(t, s.Drain(ctx), ErrZeroScheduler)
			require.ErrorIs(t, s.Close(ctx), ErrZeroScheduler)
			require.ErrorIs(t, s.Resume("k"), ErrZeroScheduler)
			require.ErrorIs(t, s.Skip("k"), ErrZeroScheduler)
			require.Equal(t, Stats{}, s.Stats())
			require.Zero(t, s.KeyDepth("k"))
			require.Empty(t, s.Parked())
			require.Empty(t, s.Keys(10))
			require.Zero(t, s.KeyAge("k"))
			require.Zero(t, s.OldestAge())
		})
	}
}

// TestZeroSchedulerEveryMethod calls every exported method of a nil and a
// zero Scheduler by reflection; a method added without a zero check fails.
func TestZeroSchedulerEveryMethod(t *testing.T) {
	zerotest.Check[Scheduler[string]](t, ErrZeroScheduler, []string{
		"Close", "Drain", "KeyAge", "KeyDepth", "Keys", "OldestAge", "Parked",
		"Resume", "Skip", "Stats", "Submit", "SubmitBatch", "TrySubmit", "TrySubmitBatch",
	})
}

// Property 10: bad input gets a clear error, and the scheduler keeps working.
func TestBadInput(t *testing.T) {
	ctx := watchdog(t)
	t.Run("unhashable interface keys", func(t *testing.T) {
		s := newSched[any](t, WithWorkers(2))
		noop := func(context.Context) error { return nil }
		type withIface struct{ V any }
		for _, key := range []any{[]int{1}, map[string]int{}, func() {}, withIface{V: []byte("x")}, math.NaN(), [1]any{[]int{}}} {
			c, err := s.Submit(ctx, key, noop)
			require.ErrorIs(t, err, ErrInvalidKey, "%T", key)
			require.Nil(t, c)
			_, err = s.TrySubmit(ctx, key, noop)
			require.ErrorIs(t, err, ErrInvalidKey)
			require.Zero(t, s.KeyDepth(key))
			require.ErrorIs(t, s.Resume(key), ErrInvalidKey)
		}
		for _, key := range []any{1, "a", withIface{V: 2}, [2]int{1, 2}, nil} {
			c, err := s.Submit(ctx, key, noop)
			require.NoError(t, err, "%T", key)
			require.NoError(t, c.Wait(ctx))
		}
		require.EqualValues(t, 12, s.Stats().Rejected)
	})
	t.Run("NaN float keys", func(t *testing.T) {
		s := newSched[float64](t)
		_, err := s.Submit(ctx, math.NaN(), func(context.Context) error { return nil })
		require.ErrorIs(t, err, ErrInvalidKey)
		c, err := s.Submit(ctx, 1.5, func(context.Context) error { return nil })
		require.NoError(t, err)
		require.NoError(t, c.Wait(ctx))
	})
	t.Run("nil task and nil context", func(t *testing.T) {
		s := newSched[int](t)
		_, err := s.Submit(ctx, 1, nil)
		require.ErrorIs(t, err, ErrNilTask)
		_, err = s.TrySubmit(ctx, 1, nil)
		require.ErrorIs(t, err, ErrNilTask)
		//nolint:staticcheck // a nil context is the bad input under test
		_, err = s.Submit(nil, 1, func(context.Context) error { return nil })
		require.ErrorIs(t, err, ErrNilContext)
		require.ErrorIs(t, s.Drain(nil), ErrNilContext) //nolint:staticcheck
		require.ErrorIs(t, s.Close(nil), ErrNilContext) //nolint:staticcheck
		require.Zero(t, s.Stats().Submitted)
	})
	t.Run("ended context", func(t *testing.T) {
		s := newSched[int](t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := s.Submit(cctx, 1, func(context.Context) error { return nil })
		require.ErrorIs(t, err, context.Canceled)
		require.Zero(t, s.KeyDepth(1))
	})
	t.Run("bad options", func(t *testing.T) {
		p, err := ants.NewPool(2)
		require.NoError(t, err)
		defer p.Release()
		released, err := ants.NewPool(1)
		require.NoError(t, err)
		released.Release()
		for name, opts := range map[string][]Option{
			"zero workers":          {WithWorkers(0)},
			"negative workers":      {WithWorkers(-1)},
			"nil pool":              {WithPool(nil)},
			"released pool":         {WithPool(released)},
			"pool and workers":      {WithPool(p), WithWorkers(2)},
			"zero key depth":        {WithMaxKeyDepth(0)},
			"zero pending":          {WithMaxPending(0)},
			"zero concurrency":      {WithMaxConcurrency(0)},
			"nil logger":            {WithLogger(nil)},
			"nil option":            {nil},
			"zero timeout":          {WithTaskTimeout(0)},
			"negative attempts":     {WithRetry(RetryPolicy{MaxAttempts: -1})},
			"retry without backoff": {WithRetry(RetryPolicy{MaxAttempts: 3})},
			"max below initial":     {WithRetry(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, MaxBackoff: time.Millisecond})},
			"shrinking multiplier":  {WithRetry(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, Multiplier: 0.5})},
			"NaN multiplier":        {WithRetry(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, Multiplier: math.NaN()})},
			"unknown policy":        {WithFailurePolicy(FailurePolicy(7))},
			"nil dead letter":       {WithDeadLetter[int](nil)},
			"dead letter key type":  {WithDeadLetter(func(DeadLetter[string]) {})},
		} {
			s, err := New[int](opts...)
			require.ErrorIs(t, err, ErrInvalidOption, name)
			require.Nil(t, s, name)
		}
		// The message names both types: the function's and the keys'.
		_, err = New[int](WithDeadLetter(func(DeadLetter[string]) {}))
		require.ErrorContains(t, err, "takes keysched.DeadLetter[string], the scheduler's keys are int")
	})
	t.Run("use after close", func(t *testing.T) {
		s, err := New[int]()
		require.NoError(t, err)
		require.NoError(t, s.Close(ctx))
		require.NoError(t, s.Close(ctx), "Close is idempotent")
		_, err = s.Submit(ctx, 1, func(context.Context) error { return nil })
		require.ErrorIs(t, err, ErrClosed)
		_, err = s.TrySubmit(ctx, 1, func(context.Context) error { return nil })
		require.ErrorIs(t, err, ErrClosed)
		require.NoError(t, s.Drain(ctx))
		// A closed scheduler answers ErrClosed, as README says, also to
		// Resume and Skip (no key can be parked once Close returned).
		require.ErrorIs(t, s.Skip(1), ErrClosed)
		require.ErrorIs(t, s.Resume(1), ErrClosed)
	})
}

// A nil *Completion, what Submit returns with its error, answers instead of
// panicking (a new user's c, _ := s.Submit(...); c.Wait(ctx) on a full key
// dereferenced nil in Wait, Err, Done and Cancel).
func TestNilCompletionAnswers(t *testing.T) {
	s, err := New[string](WithWorkers(1), WithMaxKeyDepth(1))
	require.NoError(t, err)
	defer s.Close(context.Background())
	gate := make(chan struct{})
	defer close(gate)
	_, err = s.Submit(context.Background(), "k", func(context.Context) error { <-gate; return nil })
	require.NoError(t, err)
	c, err := s.TrySubmit(context.Background(), "k", func(context.Context) error { return nil })
	require.ErrorIs(t, err, ErrKeyFull)
	require.Nil(t, c)
	require.ErrorIs(t, c.Wait(context.Background()), ErrNilCompletion)
	require.ErrorIs(t, c.Err(), ErrNilCompletion)
	select {
	case <-c.Done():
	default:
		t.Fatal("a nil Completion's Done channel is not closed")
	}
	c.Cancel()
}
