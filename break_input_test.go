package keysched

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/internal/zerotest"
)

// Every call after Close returns an error (or a zero answer), never panics or
// hangs, whether Close finished cleanly or gave up.
func TestBreakUseAfterClose(t *testing.T) {
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
		require.Error(t, s.Resume("p"))
		require.Error(t, s.Skip("p"))
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

// A Completion the caller made itself (the zero value) is no task: Cancel
// must not panic and Wait must not hang.
func TestBreakZeroCompletion(t *testing.T) {
	var c Completion
	require.NotPanics(t, c.Cancel)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.Error(t, c.Wait(ctx))
}

// The same zero Completion waited on from inside a task (the deadlock check
// walks its chain: it has none).
func TestBreakZeroCompletionWaitInTask(t *testing.T) {
	s := newSched[int](t)
	ctx := watchdog(t)
	c, err := s.Submit(ctx, 1, func(tctx context.Context) error {
		var z Completion
		wctx, cancel := context.WithCancel(tctx)
		cancel()
		if err := z.Wait(wctx); !errors.Is(err, context.Canceled) {
			return errors.New("want context.Canceled")
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
