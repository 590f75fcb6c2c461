package keysched

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// Adversarial tests of Snooze (see snooze_test.go for its specification).

// Cancel at the very instant a snooze's timer fires (same fake time: the
// order of the two is the runtime's), many times: the task ends once, as
// cancelled (no dead letter: it was waiting or between runs) or, if its run
// after the snooze started first, succeeded; the key moves on; Stats settle.
func TestBreakSnoozeCancelAsTimerFires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var dl recorder[int]
		s := newBubbleSched[int](t, WithDeadLetter(dl.fn), WithWorkers(4))
		ctx := context.Background()
		const n = 200
		var runs [n]atomic.Int32
		cs := make([]*Completion, n)
		behind := make([]*Completion, n)
		for i := range n {
			var err error
			cs[i], err = s.Submit(ctx, i, func(context.Context) error {
				if runs[i].Add(1) == 1 {
					return Snooze(errBusy, time.Second)
				}
				return nil
			})
			require.NoError(t, err)
			behind[i], err = s.Submit(ctx, i, func(context.Context) error { return nil })
			require.NoError(t, err)
		}
		synctest.Wait()
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				time.Sleep(time.Second)
				if i%2 == 0 {
					runtime.Gosched()
				}
				cs[i].Cancel()
			})
		}
		wg.Wait()
		for i := range n {
			err := cs[i].Wait(ctx)
			if err != nil {
				require.ErrorIs(t, err, context.Canceled, "task %d", i)
			}
			require.LessOrEqual(t, runs[i].Load(), int32(2))
			require.NoError(t, behind[i].Wait(ctx))
		}
		synctest.Wait()
		st := s.Stats()
		assertAccounting(t, st)
		require.EqualValues(t, n, st.Snoozed)
		require.Empty(t, dl.all(), "a task cancelled while waiting is not dead-lettered")
	})
}

// Saturating delays: Snooze with math.MaxInt64 and math.MinInt64, with and
// without a retry policy whose first delay is itself math.MaxInt64 ns. No
// panic, no wrapped (immediate) run; Cancel and Close still end the wait.
func TestBreakSnoozeExtremeDelays(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  []Option
		after time.Duration
	}{
		{"MaxInt64", nil, math.MaxInt64},
		{"MinInt64", nil, math.MinInt64},
		{"MinInt64, policy max", []Option{WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: math.MaxInt64})}, math.MinInt64},
		{"MaxInt64, policy max", []Option{WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: math.MaxInt64, Multiplier: math.MaxFloat64})}, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newBubbleSched[int](t, tc.opts...)
				ctx := context.Background()
				var runs atomic.Int32
				c, err := s.Submit(ctx, 1, func(context.Context) error {
					runs.Add(1)
					return Snooze(errBusy, tc.after)
				})
				require.NoError(t, err)
				start := time.Now()
				for range 3 {
					synctest.Wait()
					if time.Since(start) > 0 || runs.Load() > 1 {
						break
					}
				}
				if tc.after > 0 {
					require.EqualValues(t, 1, runs.Load(), "a snooze of %v ran again at once", tc.after)
				}
				c.Cancel()
				require.ErrorIs(t, c.Wait(ctx), context.Canceled)
				synctest.Wait() // the key moves on after the Completion is done
				assertAccounting(t, s.Stats())
			})
		})
	}
}

// A parked key's head, resumed, snoozes: it is not parked meanwhile (Resume
// and Skip say ErrNotParked), its dead letter after it fails again counts
// only the failed attempts since Resume, and Close giving up while it snoozes
// aborts it (Attempts 0) and the tasks behind it, letters in key order.
func TestBreakSnoozeResumedParkedHead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var dl recorder[int]
		s, err := New[int](WithLogger(quiet), WithDeadLetter(dl.fn), WithFailurePolicy(Park))
		require.NoError(t, err)
		ctx := context.Background()
		var runs atomic.Int32
		fail := errors.New("fail")
		head, err := s.Submit(ctx, 1, func(context.Context) error {
			switch r := runs.Add(1); {
			case r == 1:
				return fail
			case r <= 3:
				return Snooze(errBusy, time.Second)
			case r == 4:
				return fail
			default:
				return Snooze(errBusy, time.Hour)
			}
		})
		require.NoError(t, err)
		var behind []*Completion
		for range 3 {
			c, err := s.Submit(ctx, 1, func(context.Context) error { return nil })
			require.NoError(t, err)
			behind = append(behind, c)
		}
		synctest.Wait()
		require.Equal(t, []int{1}, s.Parked())
		require.NoError(t, s.Resume(1))
		synctest.Wait()
		require.Empty(t, s.Parked(), "a snoozing head is not parked")
		require.ErrorIs(t, s.Resume(1), ErrNotParked)
		require.ErrorIs(t, s.Skip(1), ErrNotParked)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		require.EqualValues(t, 4, runs.Load())
		require.Equal(t, []int{1}, s.Parked())
		got := dl.all()
		require.Len(t, got, 2)
		require.Equal(t, 1, got[1].Attempts, "snoozes after Resume are not attempts")
		require.Equal(t, []error{fail, fail}, got[1].Errors)
		require.NoError(t, s.Resume(1))
		synctest.Wait()
		require.EqualValues(t, 5, runs.Load())
		ended, cancel := context.WithCancel(ctx)
		cancel()
		var ce *CloseError
		require.ErrorAs(t, s.Close(ended), &ce)
		require.Equal(t, 4, ce.NotRun)
		require.ErrorIs(t, head.Wait(ctx), ErrAborted)
		for _, c := range behind {
			require.ErrorIs(t, c.Wait(ctx), ErrAborted)
		}
		require.NoError(t, s.Drain(ctx))
		got = dl.all()
		require.Len(t, got, 6)
		require.Same(t, &head.task, &head.task)
		for i, d := range got[2:] {
			require.ErrorIs(t, d.Err, ErrAborted, "letter %d", i)
			require.Zero(t, d.Attempts, "letter %d", i)
		}
		st := s.Stats()
		require.EqualValues(t, 3, st.Snoozed)
		assertAccounting(t, st)
	})
}

// runtime.Goexit in the run after a snooze is that run's panic: the task is
// finished (Panicked, one attempt), its key moves on.
func TestBreakSnoozeThenGoexit(t *testing.T) {
	for _, timeout := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			var dl recorder[int]
			opts := []Option{WithDeadLetter(dl.fn)}
			if timeout {
				opts = append(opts, WithTaskTimeout(time.Hour))
			}
			s := newBubbleSched[int](t, opts...)
			ctx := context.Background()
			var runs atomic.Int32
			c, err := s.Submit(ctx, 1, func(context.Context) error {
				if runs.Add(1) <= 2 {
					return Snooze(errBusy, time.Second)
				}
				runtime.Goexit()
				return nil
			})
			require.NoError(t, err)
			next, err := s.Submit(ctx, 1, func(context.Context) error { return nil })
			require.NoError(t, err)
			var pe *PanicError
			require.ErrorAs(t, c.Wait(ctx), &pe)
			require.NoError(t, next.Wait(ctx))
			got := dl.all()
			require.Len(t, got, 1)
			require.Equal(t, 1, got[0].Attempts)
			st := s.Stats()
			require.EqualValues(t, 1, st.Panicked)
			require.EqualValues(t, 2, st.Snoozed)
			assertAccounting(t, st)
		})
	}
}

// Close gives up while the heads of many keys snooze: each key's letters
// come in its order, every Completion is done once, Stats settle after
// Drain.
func TestBreakSnoozeCloseManyKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		order := map[int][]int{}
		s, err := New[int](WithLogger(quiet), WithWorkers(3), WithDeadLetter(func(d DeadLetter[int]) {
			mu.Lock()
			order[d.Key] = append(order[d.Key], d.Context.Value(seqKey{}).(int))
			mu.Unlock()
		}))
		require.NoError(t, err)
		const keys, per = 50, 20
		var all []*Completion
		for j := range per {
			for k := range keys {
				ctx := context.WithValue(context.Background(), seqKey{}, j)
				c, err := s.Submit(ctx, k, func(context.Context) error { return Snooze(errBusy, time.Hour) })
				require.NoError(t, err)
				all = append(all, c)
			}
		}
		synctest.Wait()
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		require.ErrorIs(t, s.Close(ended), ErrAborted)
		require.NoError(t, s.Drain(context.Background()))
		for _, c := range all {
			require.ErrorIs(t, c.Err(), ErrAborted)
		}
		for k := range keys {
			want := make([]int, per)
			for j := range want {
				want[j] = j
			}
			require.Equal(t, want, order[k], "key %d", k)
		}
		st := s.Stats()
		require.EqualValues(t, keys, st.Snoozed)
		require.EqualValues(t, keys*per, st.Aborted)
		assertAccounting(t, st)
	})
}

type seqKey struct{}

// Drain whose context ends while a key snoozes for ever says so: its error
// counts the tasks waiting to run again (before, it said "1 tasks
// unfinished, 0 keys parked", nothing about why). The count follows every
// way a wait ends: the timer, Cancel, Close's abort.
func TestBreakSnoozeDrainReportsWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := New[int](WithLogger(quiet), WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour, MaxBackoff: time.Hour}))
		require.NoError(t, err)
		t.Cleanup(func() { // a failed assertion must not leave the bubble blocked
			gone, cancel := context.WithCancel(context.Background())
			cancel()
			_ = s.Close(gone)
		})
		ctx := context.Background()
		forever := func(context.Context) error { return Snooze(errBusy, time.Hour) }
		drainErr := func() string {
			dctx, cancel := context.WithTimeout(ctx, time.Millisecond)
			defer cancel()
			err := s.Drain(dctx)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			return err.Error()
		}
		a, err := s.Submit(ctx, 1, forever)
		require.NoError(t, err)
		_, err = s.Submit(ctx, 1, forever) // behind a: queued, not waiting
		require.NoError(t, err)
		var once atomic.Bool
		_, err = s.Submit(ctx, 2, func(context.Context) error { // a retry wait of up to an hour, then success
			if once.CompareAndSwap(false, true) {
				return errBusy
			}
			return nil
		})
		require.NoError(t, err)
		synctest.Wait()
		require.Contains(t, drainErr(), "3 tasks unfinished, 0 keys parked, 2 tasks waiting to run again")
		a.Cancel()
		synctest.Wait()
		// b snoozes now, and key 2 waits.
		require.Contains(t, drainErr(), "2 tasks unfinished, 0 keys parked, 2 tasks waiting to run again")
		// Key 2's retry ran, and b's snooze fired once and snoozes again.
		time.Sleep(time.Hour + time.Second)
		synctest.Wait()
		require.Contains(t, drainErr(), "1 tasks unfinished, 0 keys parked, 1 tasks waiting to run again")
		ended, cancel := context.WithCancel(ctx)
		cancel()
		require.ErrorIs(t, s.Close(ended), ErrAborted)
		require.NoError(t, s.Drain(ctx))
		require.Zero(t, s.core.waiting.Load())
	})
}

// SubmitBatch's tasks snooze like any: each key keeps its order behind its
// snoozing head, none spends an attempt.
func TestBreakSnoozeBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var dl recorder[int]
		s := newBubbleSched[int](t, WithDeadLetter(dl.fn), WithWorkers(2))
		ctx := context.Background()
		var mu sync.Mutex
		order := map[int][]int{}
		var items []BatchItem[int]
		for i := range 60 {
			var snoozes int
			items = append(items, BatchItem[int]{Key: i % 3, Task: func(ctx context.Context) error {
				if snoozes < i%4 {
					snoozes++
					return Snooze(errBusy, time.Duration(i)*time.Millisecond)
				}
				require.Equal(t, 1, Attempt(ctx))
				mu.Lock()
				order[i%3] = append(order[i%3], i)
				mu.Unlock()
				return nil
			}})
		}
		cs, err := s.SubmitBatch(ctx, items)
		require.NoError(t, err)
		for _, c := range cs {
			require.NoError(t, c.Wait(ctx))
		}
		require.NoError(t, s.Drain(ctx))
		for k := range 3 {
			for j := 1; j < len(order[k]); j++ {
				require.Less(t, order[k][j-1], order[k][j], "key %d", k)
			}
			require.Len(t, order[k], 20)
		}
		require.Empty(t, dl.all())
		st := s.Stats()
		require.EqualValues(t, 90, st.Snoozed) // 15 of each i%4: 15*(0+1+2+3)
		assertAccounting(t, st)
	})
}

// After a Close that gave up on a task that ignores its context, a second
// Close and a Drain race: the second Close returns the first's *CloseError
// at once, Drain waits for the task and the letters behind it, and then
// Stats are settled.
func TestBreakSecondCloseRacesDrain(t *testing.T) {
	var letters atomic.Int64
	s, err := New[int](WithLogger(quiet), WithWorkers(2), WithDeadLetter(func(DeadLetter[int]) { letters.Add(1) }))
	require.NoError(t, err)
	ctx := context.Background()
	gate := make(chan struct{})
	started := make(chan struct{})
	_, err = s.Submit(ctx, 1, func(context.Context) error { close(started); <-gate; return nil })
	require.NoError(t, err)
	for range 10 {
		_, err = s.Submit(ctx, 1, func(context.Context) error { return Snooze(errBusy, time.Hour) })
		require.NoError(t, err)
	}
	<-started
	ended, cancel := context.WithCancel(ctx)
	cancel()
	var first *CloseError
	require.ErrorAs(t, s.Close(ended), &first)
	require.Equal(t, 1, first.Running)
	drained := make(chan error, 1)
	go func() { drained <- s.Drain(ctx) }()
	var second *CloseError
	require.ErrorAs(t, s.Close(ctx), &second)
	require.Same(t, first, second)
	close(gate)
	require.NoError(t, <-drained)
	require.EqualValues(t, 10, letters.Load())
	st := s.Stats()
	require.EqualValues(t, 1, st.Succeeded)
	require.EqualValues(t, 10, st.Aborted)
	assertAccounting(t, st)
}
