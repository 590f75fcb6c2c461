package keysched

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Tasks that end with runtime.Goexit (t.FailNow in a callback does), mixed
// with retries, Park with Resume, and an aborting Close: every worker comes
// back, every Completion is done, Stats settles, nothing leaks (TestMain's
// goleak).
func TestBreakGoexitMix(t *testing.T) {
	for _, park := range []bool{false, true} {
		var letters atomic.Int64
		opts := []Option{WithLogger(quiet), WithWorkers(2), WithMaxKeyDepth(4),
			WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: 50 * time.Microsecond}), WithRetryPanics(),
			WithDeadLetter(func(DeadLetter[int]) { letters.Add(1) })}
		if park {
			opts = append(opts, WithFailurePolicy(Park))
		}
		s, err := New[int](opts...)
		require.NoError(t, err)
		ctx := watchdog(t)
		var all []*Completion
		flip := 0
		for i := range 200 {
			i := i
			task := func(tctx context.Context) error {
				if i%3 == 0 && Attempt(tctx) == 1 || i%11 == 0 {
					runtime.Goexit()
				}
				return nil
			}
			c, err := s.TrySubmit(ctx, i%5, task)
			for errors.Is(err, ErrKeyFull) { // a parked key: resume or skip it
				for _, k := range s.Parked() {
					if flip++; flip%2 == 0 {
						_ = s.Resume(k)
					} else {
						_ = s.Skip(k)
					}
				}
				if ctx.Err() != nil {
					t.Fatalf("key %d stuck: stats %+v keys %+v parked %v head state %d", i%5, s.Stats(), s.Keys(0), s.Parked(), headState(s, i%5))
				}
				runtime.Gosched()
				c, err = s.TrySubmit(ctx, i%5, task)
			}
			if err != nil {
				t.Fatalf("key %d stuck (%v): stats %+v keys %+v parked %v head state %d", i%5, err, s.Stats(), s.Keys(0), s.Parked(), headState(s, i%5))
			}
			all = append(all, c)
		}
		if park {
			for s.Stats().Pending > 0 {
				for _, k := range s.Parked() {
					_ = s.Skip(k)
				}
				require.NoError(t, ctx.Err())
				runtime.Gosched()
			}
		}
		require.NoError(t, s.Drain(ctx))
		for _, c := range all {
			<-c.Done()
		}
		st := s.Stats()
		assertAccounting(t, st)
		require.Zero(t, st.Keys)
		require.Zero(t, st.Running)
		require.Equal(t, uint64(letters.Load()), st.DeadLettered)
		require.NotZero(t, st.Panicked)
		// And the workers all came back: a full round runs.
		var ran atomic.Int64
		for k := range 10 {
			_, err := s.Submit(ctx, k, func(context.Context) error { ran.Add(1); return nil })
			require.NoError(t, err)
		}
		require.NoError(t, s.Drain(ctx))
		require.EqualValues(t, 10, ran.Load())
		require.NoError(t, s.Close(ctx))
	}
}

func headState(s *Scheduler[int], k int) uint32 {
	ch, ok := s.tails.load(k)
	if !ok {
		return 99
	}
	return ch.head.Load().state.Load()
}
