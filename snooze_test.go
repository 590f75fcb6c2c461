// Snooze: a run that did not really start, run again later without
// spending an attempt.

package keysched

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// The tests of Snooze run in testing/synctest bubbles (see retry_test.go):
// "exactly one hour passed" and "no time passed" are exact statements.

var errBusy = errors.New("busy: refused locally")

// A task that snoozes 5 times then succeeds, on a scheduler that attempts a
// task once (MaxAttempts 1), succeeds and is never dead-lettered; each snooze
// waits exactly its after; Attempt and the Observer give every run number 1;
// Stats counts 5 snoozes and no retry.
func TestSnoozeIsNotAnAttempt(t *testing.T) {
	for _, policy := range []struct {
		name string
		opts []Option
	}{
		{"no retry policy", nil},
		{"MaxAttempts 1", []Option{WithRetry(RetryPolicy{MaxAttempts: 1})}},
		{"MaxAttempts 2", []Option{WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour})}},
	} {
		t.Run(policy.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var dl recorder[string]
				var mu sync.Mutex
				var ended []AttemptInfo
				obs := Observer[string]{AttemptEnded: func(_ string, a AttemptInfo) {
					mu.Lock()
					ended = append(ended, a)
					mu.Unlock()
				}}
				s := newBubbleSched[string](t, append([]Option{WithDeadLetter(dl.fn), WithObserver(obs)}, policy.opts...)...)
				ctx := context.Background()
				start := time.Now()
				var runs []int
				var at []time.Duration
				c, err := s.Submit(ctx, "k", func(ctx context.Context) error {
					runs = append(runs, Attempt(ctx))
					at = append(at, time.Since(start))
					if len(runs) <= 5 {
						return Snooze(errBusy, time.Second)
					}
					return nil
				})
				require.NoError(t, err)
				require.NoError(t, c.Wait(ctx))
				require.Equal(t, []int{1, 1, 1, 1, 1, 1}, runs, "Attempt: a snoozed run is not an attempt")
				want := []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 5 * time.Second}
				require.Equal(t, want, at, "each snooze waits exactly its after")
				require.Empty(t, dl.all())
				st := s.Stats()
				require.EqualValues(t, 5, st.Snoozed)
				require.Zero(t, st.Retried)
				require.EqualValues(t, 1, st.Succeeded)
				require.Zero(t, st.DeadLettered)
				assertAccounting(t, st)
				mu.Lock()
				defer mu.Unlock()
				require.Len(t, ended, 6, "the observer sees every run")
				for i, a := range ended {
					require.Equal(t, 1, a.N, "run %d", i)
					require.Equal(t, i < 5, IsSnoozed(a.Err), "run %d: %v", i, a.Err)
				}
			})
		})
	}
}

// While a task snoozes, its key's later task waits behind it (order holds),
// and the wait holds no worker: on a one-worker pool another key's tasks all
// run meanwhile, with no time passing.
func TestSnoozeKeepsKeyOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newBubbleSched[string](t, WithWorkers(1))
		ctx := context.Background()
		var mu sync.Mutex
		var log []string
		add := func(s string) { mu.Lock(); log = append(log, s); mu.Unlock() }
		var runs atomic.Int32
		first, err := s.Submit(ctx, "a", func(context.Context) error {
			if runs.Add(1) <= 3 {
				add("a1 snoozed")
				return Snooze(errBusy, time.Minute)
			}
			add("a1 done")
			return nil
		})
		require.NoError(t, err)
		second, err := s.Submit(ctx, "a", func(context.Context) error { add("a2"); return nil })
		require.NoError(t, err)
		synctest.Wait()
		start := time.Now()
		otherKeyRunsMeanwhile(t, s, "b", 50, "another key's task waited for the snooze")
		require.Equal(t, start, time.Now())
		require.False(t, isDone(second), "the key's later task ran while its head snoozed")
		require.NoError(t, first.Wait(ctx))
		require.NoError(t, second.Wait(ctx))
		require.Equal(t, []string{"a1 snoozed", "a1 snoozed", "a1 snoozed", "a1 done", "a2"}, log)
		require.EqualValues(t, 3, s.Stats().Snoozed)
	})
}

// Cancel withdraws a task waiting out a snooze (its key moves on at once);
// Close's abort completes one with ErrAborted, dead-lettered with 0
// attempts; a run cancelled while running that returns Snooze is not snoozed
// again: its error is the outcome, counted as its attempt.
func TestSnoozeCancelAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var dl recorder[int]
		s := newAbortedBubbleSched[int](t, WithDeadLetter(dl.fn))
		ctx := context.Background()
		snoozer := func(context.Context) error { return Snooze(errBusy, time.Hour) }

		c, err := s.Submit(ctx, 1, snoozer)
		require.NoError(t, err)
		next, err := s.Submit(ctx, 1, func(context.Context) error { return nil })
		require.NoError(t, err)
		synctest.Wait()
		start := time.Now()
		c.Cancel()
		require.ErrorIs(t, c.Wait(ctx), context.Canceled)
		require.NoError(t, next.Wait(ctx))
		require.Equal(t, start, time.Now(), "the key moved on without waiting out the snooze")

		// Cancelled while running: the Snooze it returns ends it.
		var runs atomic.Int32
		running, err := s.Submit(ctx, 2, func(ctx context.Context) error {
			runs.Add(1)
			<-ctx.Done()
			return Snooze(ctx.Err(), time.Hour)
		})
		require.NoError(t, err)
		synctest.Wait()
		running.Cancel()
		require.ErrorIs(t, running.Wait(ctx), context.Canceled)
		require.True(t, IsSnoozed(running.Err()))
		require.EqualValues(t, 1, runs.Load())

		require.ErrorIs(t, closeAbortsWaitingKey(t, s, 3, snoozer), ErrAborted)
		st := s.Stats()
		require.EqualValues(t, 2, st.Aborted)
		require.EqualValues(t, 2, st.Cancelled)
		require.EqualValues(t, 2, st.Snoozed)
		assertAccounting(t, st)
		got := dl.all()
		require.Len(t, got, 3) // the task cancelled while running, and the 2 Close aborted
		byKey := map[int][]DeadLetter[int]{}
		for _, d := range got {
			byKey[d.Key] = append(byKey[d.Key], d)
		}
		require.Len(t, byKey[2], 1)
		require.Equal(t, 1, byKey[2][0].Attempts, "a run cancelled while running counts")
		require.Len(t, byKey[3], 2)
		for _, d := range byKey[3] {
			require.ErrorIs(t, d.Err, ErrAborted)
			require.Zero(t, d.Attempts, "a snoozed run is not an attempt")
		}
	})
}

// WithTaskTimeout bounds every run, snoozed or not: each gets the full
// timeout from its own start.
func TestSnoozeTaskTimeoutPerRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newBubbleSched[int](t, WithTaskTimeout(50*time.Millisecond))
		ctx := context.Background()
		var left []time.Duration
		var runs int
		c, err := s.Submit(ctx, 1, func(ctx context.Context) error {
			runs++
			d, ok := ctx.Deadline()
			require.True(t, ok)
			left = append(left, time.Until(d))
			if runs <= 2 {
				time.Sleep(40 * time.Millisecond) // fake time: the run's own work
				return Snooze(errBusy, time.Second)
			}
			<-ctx.Done()
			return ctx.Err()
		})
		require.NoError(t, err)
		require.ErrorIs(t, c.Wait(ctx), context.DeadlineExceeded)
		require.Equal(t, []time.Duration{50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond}, left)
	})
}

// after <= 0: the policy's first delay (full jitter on [0, InitialBackoff]);
// without a retry policy, 1 ms (never 0: no spinning).
func TestSnoozeDefaultDelay(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     []Option
		after    time.Duration
		min, max time.Duration
	}{
		{"no policy, 0", nil, 0, time.Millisecond, time.Millisecond},
		{"no policy, negative", nil, -time.Hour, time.Millisecond, time.Millisecond},
		{"policy, 0", []Option{WithRetry(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, MaxBackoff: time.Hour})}, 0, 0, time.Second},
		{"policy, explicit", []Option{WithRetry(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second})}, 90 * time.Minute, 90 * time.Minute, 90 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newBubbleSched[int](t, tc.opts...)
				ctx := context.Background()
				var starts []time.Time
				c, err := s.Submit(ctx, 1, func(context.Context) error {
					starts = append(starts, time.Now())
					if len(starts) <= 20 {
						return Snooze(errBusy, tc.after)
					}
					return nil
				})
				require.NoError(t, err)
				require.NoError(t, c.Wait(ctx))
				for i := 1; i < len(starts); i++ {
					d := starts[i].Sub(starts[i-1])
					require.True(t, d >= tc.min && d <= tc.max, "delay %v not in [%v, %v]", d, tc.min, tc.max)
				}
			})
		})
	}
}

// The wrapper: nil stays nil; errors.Is/As see the inner error; Permanent
// wins over Snooze in either nesting; IsSnoozed sees through wrapping.
func TestSnoozeWrapper(t *testing.T) {
	require.NoError(t, Snooze(nil, time.Second))
	var pe *PanicError
	inner := &PanicError{Value: "x"}
	z := fmt.Errorf("ctx: %w", Snooze(inner, time.Second))
	require.True(t, IsSnoozed(z))
	require.ErrorAs(t, z, &pe)
	require.Same(t, inner, pe)
	require.ErrorIs(t, Snooze(errBusy, 0), errBusy)
	require.Equal(t, errBusy.Error(), Snooze(errBusy, 0).Error())
	require.False(t, IsSnoozed(errBusy))
	judged := func(err error) verdict {
		v, got, panicked := judge(err)
		require.False(t, panicked)
		require.Same(t, err, got)
		return v
	}
	require.Equal(t, verdict{snooze: true, after: time.Second}, judged(z))
	require.Equal(t, verdict{snooze: true, after: 2 * time.Second}, judged(Snooze(Snooze(errBusy, time.Second), 2*time.Second)))
	require.Equal(t, verdict{permanent: true}, judged(Permanent(Snooze(errBusy, time.Second))))
	require.Equal(t, verdict{permanent: true}, judged(Snooze(Permanent(errBusy), time.Second)))
}

type unwrapPanics struct{}

func (unwrapPanics) Error() string { return "unwrap panics" }
func (unwrapPanics) Unwrap() error { panic("unwrap") }

// step is one run's result in the budget tests.
type step byte

const (
	sOK   step = 'o' // nil
	sFail step = 'f' // a normal, retryable failure
	sSnz  step = 's' // Snooze
	sPerm step = 'p' // Permanent
	sPnc  step = '!' // panic(Snooze(...)): a panic, not a snooze
	sPS   step = 'P' // Permanent(Snooze(...))
)

// budgetModel says what a scheduler with MaxAttempts max makes of a task
// whose runs return script in turn: how many runs happen, whether it
// succeeds, and (if not) how many attempts its dead letter counts and which
// run numbers Attempt gives.
func budgetModel(script []step, max int) (runs int, ok bool, attempts int, nums []int) {
	counted := 0
	for _, st := range script {
		runs++
		nums = append(nums, counted+1)
		switch st {
		case sOK:
			return runs, true, 0, nums
		case sSnz:
			continue
		case sFail:
			counted++
			if counted < max {
				continue
			}
		default:
			counted++
		}
		return runs, false, counted, nums
	}
	panic("script too short")
}

func runScript(t *testing.T, script []step, max int) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		var dl recorder[int]
		s := newBubbleSched[int](t, WithDeadLetter(dl.fn),
			WithRetry(RetryPolicy{MaxAttempts: max, InitialBackoff: time.Second}))
		ctx := context.Background()
		var nums []int
		i := 0
		c, err := s.Submit(ctx, 1, func(ctx context.Context) error {
			nums = append(nums, Attempt(ctx))
			st := script[i]
			i++
			switch st {
			case sOK:
				return nil
			case sFail:
				return errFail
			case sSnz:
				return Snooze(errBusy, time.Minute)
			case sPerm:
				return Permanent(errFail)
			case sPnc:
				panic(Snooze(errBusy, time.Minute))
			case sPS:
				return Permanent(Snooze(errBusy, time.Minute))
			}
			panic("bad step")
		})
		require.NoError(t, err)
		werr := c.Wait(ctx)
		runs, ok, attempts, wantNums := budgetModel(script, max)
		require.Equal(t, runs, i, "runs")
		require.Equal(t, wantNums, nums, "Attempt of each run")
		st := s.Stats()
		snoozes, fails := 0, 0
		for _, x := range script[:runs] {
			switch x {
			case sSnz:
				snoozes++
			case sFail:
				fails++
			}
		}
		require.EqualValues(t, snoozes, st.Snoozed)
		if ok {
			require.NoError(t, werr)
			require.Empty(t, dl.all())
			require.EqualValues(t, fails, st.Retried)
			return
		}
		require.Error(t, werr)
		got := dl.all()
		require.Len(t, got, 1)
		require.Equal(t, attempts, got[0].Attempts)
		require.Len(t, got[0].Errors, attempts, "only counted attempts are listed")
		for _, e := range got[0].Errors {
			if !errors.As(e, new(*PanicError)) {
				require.False(t, IsSnoozed(e) && !IsPermanent(e), "a snoozed run in Errors: %v", e)
			}
		}
	})
}

// Table of the interaction of Snooze with normal failures, Permanent and
// panics: snoozes never spend the budget, a normal failure after any number
// of them still has its full budget, Permanent and panics win.
func TestSnoozeBudgetTable(t *testing.T) {
	for _, tc := range []struct {
		script string
		max    int
	}{
		{"ssssso", 1},
		{"sssssf", 1}, // the budget of 1 is spent by the failure only
		{"sfsfso", 3}, // two failures among snoozes, then success
		{"fsfsf", 3},  // three failures: dead letter with 3 attempts
		{"ssssssssssfff", 3},
		{"sp", 5}, // Permanent after a snooze: fails now, 1 attempt
		{"P", 5},  // Permanent(Snooze(..)): Permanent wins
		{"s!", 5}, // a panicking Snooze is a panic
		{"fssfssfo", 4},
	} {
		t.Run(fmt.Sprintf("%s/max%d", tc.script, tc.max), func(t *testing.T) {
			runScript(t, []step(tc.script), tc.max)
		})
	}
}

// Property: random scripts agree with the model.
func TestSnoozeBudgetProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	kinds := []step{sOK, sFail, sFail, sFail, sSnz, sSnz, sSnz, sSnz, sPerm, sPnc, sPS}
	for i := range 60 {
		max := 1 + r.IntN(4)
		var script []step
		for {
			st := kinds[r.IntN(len(kinds))]
			script = append(script, st)
			if st == sOK || st == sPerm || st == sPnc || st == sPS {
				break
			}
			if n := len(script); n > 40 {
				script = append(script, sOK)
				break
			}
		}
		t.Run(fmt.Sprintf("%d/%s/max%d", i, string(script), max), func(t *testing.T) {
			runScript(t, script, max)
		})
	}
}

// Written to attack Snooze (adversarial review, 2026-11-30); it held.
//
// Cancel at the very instant a snooze's timer fires (same fake time: the
// order of the two is the runtime's), many times: the task ends once, as
// cancelled (no dead letter: it was waiting or between runs) or, if its run
// after the snooze started first, succeeded; the key moves on; Stats settle.
func TestSnoozeCancelledAsTimerFiresEndsOnce(t *testing.T) {
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

// Written to attack Snooze (adversarial review, 2026-11-30); it held.
//
// Saturating delays: Snooze with math.MaxInt64 and math.MinInt64, with and
// without a retry policy whose first delay is itself math.MaxInt64 ns. No
// panic, no wrapped (immediate) run; Cancel and Close still end the wait.
func TestSnoozeExtremeDelaysSaturate(t *testing.T) {
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

// Written to attack Snooze (adversarial review, 2026-11-30); it held.
//
// A parked key's head, resumed, snoozes: it is not parked meanwhile (Resume
// and Skip say ErrNotParked), its dead letter after it fails again counts
// only the failed attempts since Resume, and Close giving up while it snoozes
// aborts it (Attempts 0) and the tasks behind it, letters in key order.
func TestSnoozeOfResumedParkedHead(t *testing.T) {
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

// Written to attack Snooze (adversarial review, 2026-11-30); it held.
//
// runtime.Goexit in the run after a snooze is that run's panic: the task is
// finished (Panicked, one attempt), its key moves on.
func TestSnoozeThenGoexitIsAPanic(t *testing.T) {
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
			// A done Completion may not be passed by its key yet (Stats
			// settles once the scheduler is idle): Drain first.
			require.NoError(t, s.Drain(ctx))
			st := s.Stats()
			require.EqualValues(t, 1, st.Panicked)
			require.EqualValues(t, 2, st.Snoozed)
			assertAccounting(t, st)
		})
	}
}

// Written to attack Snooze (adversarial review, 2026-11-30); it held.
//
// Close gives up while the heads of many keys snooze: each key's letters
// come in its order, every Completion is done once, Stats settle after
// Drain.
func TestCloseGivingUpOnSnoozingKeysKeepsKeyOrder(t *testing.T) {
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

// Found by attacking the code (adversarial review, 2026-11-30): a key snoozing
// for ever made Drain's error say only "1 tasks unfinished, 0 keys parked".
//
// Drain whose context ends while a key snoozes for ever says so: its error
// counts the tasks waiting to run again (before, it said "1 tasks
// unfinished, 0 keys parked", nothing about why). The count follows every
// way a wait ends: the timer, Cancel, Close's abort.
func TestDrainErrorCountsSnoozingTasks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newAbortedBubbleSched[int](t, WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour, MaxBackoff: time.Hour}))
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

// Written to attack Snooze (adversarial review, 2026-11-30); it held.
//
// SubmitBatch's tasks snooze like any: each key keeps its order behind its
// snoozing head, none spends an attempt.
func TestSnoozeInBatchKeepsKeyOrder(t *testing.T) {
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
