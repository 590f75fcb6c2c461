package keysched

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// The tests in this file run inside testing/synctest bubbles: time is fake,
// moves only when every goroutine in the bubble is blocked, and
// synctest.Wait returns once they all are. So "no time passed" is an exact
// statement, and backoffs of seconds take no real time.

var errFail = errors.New("attempt failed")

// recorder is a dead-letter function that keeps what it gets.
type recorder[K comparable] struct {
	mu  sync.Mutex
	got []DeadLetter[K]
}

func (r *recorder[K]) fn(dl DeadLetter[K]) { r.mu.Lock(); r.got = append(r.got, dl); r.mu.Unlock() }
func (r *recorder[K]) all() []DeadLetter[K] {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]DeadLetter[K](nil), r.got...)
}

func newBubbleSched[K comparable](t *testing.T, opts ...Option) *Scheduler[K] {
	t.Helper()
	s, err := New[K](append([]Option{WithLogger(quiet)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close(context.Background())) })
	return s
}

// Retry 1: fails twice then succeeds: three attempts; the key's next task
// starts after the third; on a one-worker pool another key's 100 tasks all
// finish during the backoff.
func TestRetryThenSucceed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newBubbleSched[string](t, WithWorkers(1),
			WithRetry(RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Second, MaxBackoff: 10 * time.Second}))
		ctx := context.Background()
		start := time.Now()
		var attempts atomic.Int32
		var third, next time.Time
		c1, err := s.Submit(ctx, "a", func(ctx context.Context) error {
			n := attempts.Add(1)
			require.EqualValues(t, n, Attempt(ctx))
			if n < 3 {
				return errFail
			}
			third = time.Now()
			return nil
		})
		require.NoError(t, err)
		c2, err := s.Submit(ctx, "a", func(context.Context) error { next = time.Now(); return nil })
		require.NoError(t, err)
		synctest.Wait() // the first attempt failed; the key waits out a backoff
		require.EqualValues(t, 1, attempts.Load())

		var others []*Completion
		for range 100 {
			c, err := s.Submit(ctx, "b", func(context.Context) error { return nil })
			require.NoError(t, err)
			others = append(others, c)
		}
		synctest.Wait()
		for _, c := range others {
			require.NoError(t, c.Err())
			select {
			case <-c.Done():
			default:
				t.Fatal("another key's task waited for the backoff")
			}
		}
		require.Equal(t, start, time.Now(), "no time passed: the backoff held neither the worker nor the other key")
		require.Nil(t, c2.Err())

		require.NoError(t, c1.Wait(ctx))
		require.NoError(t, c2.Wait(ctx))
		require.EqualValues(t, 3, attempts.Load())
		require.False(t, next.Before(third), "the key's next task started before the third attempt")
		st := s.Stats()
		require.EqualValues(t, 2, st.Retried)
		require.EqualValues(t, 102, st.Succeeded)
		require.Zero(t, st.DeadLettered)
	})
}

// Retry 2: a Permanent error is attempted once and dead-lettered.
func TestPermanentIsNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var dl recorder[int]
		s := newBubbleSched[int](t, WithDeadLetter(dl.fn),
			WithRetry(RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Second}))
		var attempts atomic.Int32
		c, err := s.Submit(context.Background(), 7, func(context.Context) error {
			attempts.Add(1)
			return Permanent(errFail)
		})
		require.NoError(t, err)
		require.ErrorIs(t, c.Wait(context.Background()), errFail)
		require.True(t, IsPermanent(c.Err()))
		require.EqualValues(t, 1, attempts.Load())
		got := dl.all()
		require.Len(t, got, 1)
		require.Equal(t, 7, got[0].Key)
		require.Equal(t, 1, got[0].Attempts)
		require.ErrorIs(t, got[0].Err, errFail)
		require.NotNil(t, got[0].Task)
		require.EqualValues(t, 1, s.Stats().Failed)
		require.Zero(t, s.Stats().Retried)
	})
}

// Retry 3: exhausted attempts under Continue: dead-lettered with the right
// count, times and errors; the key's next task runs.
func TestExhaustedAttemptsContinue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var dl recorder[string]
		s := newBubbleSched[string](t, WithDeadLetter(dl.fn),
			WithRetry(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, Multiplier: 3}))
		ctx := context.Background()
		var ends []time.Time
		task := func(context.Context) error {
			ends = append(ends, time.Now())
			return errFail
		}
		c1, err := s.Submit(ctx, "k", task)
		require.NoError(t, err)
		ran := make(chan struct{})
		c2, err := s.Submit(ctx, "k", func(context.Context) error { close(ran); return nil })
		require.NoError(t, err)
		require.ErrorIs(t, c1.Wait(ctx), errFail)
		require.NoError(t, c2.Wait(ctx))
		<-ran
		require.Len(t, ends, 3)
		got := dl.all()
		require.Len(t, got, 1)
		d := got[0]
		require.Equal(t, "k", d.Key)
		require.Equal(t, 3, d.Attempts)
		require.Len(t, d.Errors, 3)
		require.ErrorIs(t, d.Err, errFail)
		require.Equal(t, ends[0], d.FirstAttempt)
		require.Equal(t, ends[2], d.LastAttempt)
		// Full jitter: the first delay is within [0, 1s], the second
		// within [0, 3s].
		require.LessOrEqual(t, ends[1].Sub(ends[0]), time.Second)
		require.LessOrEqual(t, ends[2].Sub(ends[1]), 3*time.Second)
		st := s.Stats()
		require.EqualValues(t, 1, st.Failed)
		require.EqualValues(t, 1, st.DeadLettered)
		require.EqualValues(t, 2, st.Retried)
		require.EqualValues(t, 1, st.Succeeded)
	})
}

// Retry 4: Park stops the key until Resume (which retries the head with a
// fresh budget) or Skip; other keys are not affected.
func TestParkResumeSkip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var dl recorder[string]
		s := newBubbleSched[string](t, WithDeadLetter(dl.fn), WithFailurePolicy(Park),
			WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second}))
		ctx := context.Background()
		var attempts atomic.Int32
		healthy := atomic.Bool{}
		head, err := s.Submit(ctx, "p", func(context.Context) error {
			attempts.Add(1)
			if healthy.Load() {
				return nil
			}
			return errFail
		})
		require.NoError(t, err)
		var laterRan atomic.Int32
		var later []*Completion
		for range 3 {
			c, err := s.Submit(ctx, "p", func(context.Context) error { laterRan.Add(1); return nil })
			require.NoError(t, err)
			later = append(later, c)
		}
		other, err := s.Submit(ctx, "q", func(context.Context) error { return nil })
		require.NoError(t, err)
		require.NoError(t, other.Wait(ctx))

		time.Sleep(time.Hour) // far past any backoff
		synctest.Wait()
		require.Equal(t, []string{"p"}, s.Parked())
		require.EqualValues(t, 2, attempts.Load())
		require.Len(t, dl.all(), 1, "dead-lettered once when it parked")
		require.Nil(t, head.Err(), "a parked task is not finished")
		require.Zero(t, laterRan.Load(), "the key's later tasks wait while it is parked")
		require.Equal(t, 4, s.KeyDepth("p"))
		require.Equal(t, 1, s.Stats().ParkedKeys)

		// Resume with the fault still there: a fresh budget of two attempts,
		// then parked again.
		require.NoError(t, s.Resume("p"))
		require.ErrorIs(t, s.Resume("p"), ErrNotParked)
		time.Sleep(time.Hour)
		synctest.Wait()
		require.EqualValues(t, 4, attempts.Load())
		require.Equal(t, []string{"p"}, s.Parked())
		require.Len(t, dl.all(), 2)
		require.Equal(t, 2, dl.all()[1].Attempts, "attempts since the Resume")

		// Fixed: Resume runs it and the key goes on.
		healthy.Store(true)
		require.NoError(t, s.Resume("p"))
		require.NoError(t, head.Wait(ctx))
		for _, c := range later {
			require.NoError(t, c.Wait(ctx))
		}
		require.Empty(t, s.Parked())

		// Skip: the parked head is given up as failed; the key goes on.
		healthy.Store(false)
		bad, err := s.Submit(ctx, "p", func(context.Context) error { return errFail })
		require.NoError(t, err)
		after, err := s.Submit(ctx, "p", func(context.Context) error { return nil })
		require.NoError(t, err)
		time.Sleep(time.Hour)
		synctest.Wait()
		require.Equal(t, []string{"p"}, s.Parked())
		require.NoError(t, s.Skip("p"))
		require.ErrorIs(t, bad.Wait(ctx), errFail)
		require.NoError(t, after.Wait(ctx))
		require.ErrorIs(t, s.Skip("p"), ErrNotParked)
		require.NoError(t, s.Drain(ctx))
		st := s.Stats()
		require.EqualValues(t, 1, st.Failed)
		require.Zero(t, st.ParkedKeys)
		assertAccounting(t, st)
	})
}

// Retry 5: jitter spreads the retries of keys that failed together.
func TestJitterSpreadsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const keys = 200
		s := newBubbleSched[int](t, WithWorkers(8),
			WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second}))
		ctx := context.Background()
		start := time.Now()
		var mu sync.Mutex
		delays := map[time.Duration]int{}
		for k := range keys {
			_, err := s.Submit(ctx, k, func(ctx context.Context) error {
				if Attempt(ctx) == 1 {
					return errFail
				}
				mu.Lock()
				delays[time.Since(start)]++
				mu.Unlock()
				return nil
			})
			require.NoError(t, err)
		}
		require.NoError(t, s.Drain(ctx))
		var sum time.Duration
		for d, n := range delays {
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.LessOrEqual(t, d, time.Second)
			sum += d * time.Duration(n)
		}
		// Uniform on [0, 1s]: 200 draws are (nearly) all distinct, and their
		// mean is 0.5s give or take 0.1s (more than 4 standard errors).
		require.Greater(t, len(delays), keys*9/10, "retries in lockstep")
		mean := sum / keys
		require.InDelta(t, float64(500*time.Millisecond), float64(mean), float64(100*time.Millisecond))
	})
}

// The jitter window itself: [0, min(MaxBackoff, Initial*Multiplier^(n-2))].
func TestBackoffCeiling(t *testing.T) {
	p := RetryPolicy{MaxAttempts: 10, InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}
	require.Equal(t, 100*time.Millisecond, p.ceiling(2))
	require.Equal(t, 200*time.Millisecond, p.ceiling(3))
	require.Equal(t, 800*time.Millisecond, p.ceiling(5))
	require.Equal(t, time.Second, p.ceiling(6))
	require.Equal(t, time.Second, p.ceiling(1000))
	p.Multiplier = 1.5
	require.Equal(t, 150*time.Millisecond, p.ceiling(3))
	// Without MaxBackoff: capped at max(InitialBackoff, 1 minute), never
	// overflowing.
	huge := RetryPolicy{MaxAttempts: 1 << 20, InitialBackoff: time.Hour, Multiplier: 10}
	require.Equal(t, time.Hour, huge.ceiling(1<<20))
	small := RetryPolicy{MaxAttempts: 100, InitialBackoff: time.Millisecond}
	require.Equal(t, time.Minute, small.ceiling(100))
	for range 1000 {
		d := p.delay(4)
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.LessOrEqual(t, d, p.ceiling(4))
	}
}

// Retry 6: WithTaskTimeout gives each attempt a deadline; an attempt that
// overruns sees it, and counts as a failed (retried) attempt.
func TestTaskTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var dl recorder[int]
		s := newBubbleSched[int](t, WithTaskTimeout(50*time.Millisecond), WithDeadLetter(dl.fn),
			WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}))
		ctx := context.Background()
		var seen []error
		var deadlines []time.Duration
		c, err := s.Submit(ctx, 1, func(ctx context.Context) error {
			d, ok := ctx.Deadline()
			require.True(t, ok)
			deadlines = append(deadlines, time.Until(d))
			<-ctx.Done()
			seen = append(seen, ctx.Err())
			return ctx.Err()
		})
		require.NoError(t, err)
		require.ErrorIs(t, c.Wait(ctx), context.DeadlineExceeded)
		require.Equal(t, []error{context.DeadlineExceeded, context.DeadlineExceeded}, seen)
		require.Equal(t, []time.Duration{50 * time.Millisecond, 50 * time.Millisecond}, deadlines)
		got := dl.all()
		require.Len(t, got, 1)
		require.Equal(t, 2, got[0].Attempts)
		require.EqualValues(t, 1, s.Stats().Retried)

		// An attempt that finishes in time is not affected.
		ok, err := s.Submit(ctx, 2, func(ctx context.Context) error {
			time.Sleep(10 * time.Millisecond)
			return ctx.Err()
		})
		require.NoError(t, err)
		require.NoError(t, ok.Wait(ctx))
	})
}

// Retry 7: a poison task (always fails) never delays other keys.
func TestPoisonTaskDelaysNobody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newBubbleSched[int](t, WithWorkers(2),
			WithRetry(RetryPolicy{MaxAttempts: 50, InitialBackoff: 10 * time.Millisecond, MaxBackoff: time.Second}))
		ctx := context.Background()
		var poisonAttempts atomic.Int32
		poison, err := s.Submit(ctx, 0, func(context.Context) error { poisonAttempts.Add(1); return errFail })
		require.NoError(t, err)
		for round := range 5 {
			start := time.Now()
			var cs []*Completion
			for k := 1; k <= 200; k++ {
				c, err := s.Submit(ctx, k, func(context.Context) error { return nil })
				require.NoError(t, err)
				cs = append(cs, c)
			}
			synctest.Wait()
			for _, c := range cs {
				require.NoError(t, c.Err())
				select {
				case <-c.Done():
				default:
					t.Fatalf("round %d: a healthy key waited on the poison key", round)
				}
			}
			require.Equal(t, start, time.Now())
			time.Sleep(100 * time.Millisecond) // let the poison key retry meanwhile
		}
		require.Greater(t, poisonAttempts.Load(), int32(5))
		require.ErrorIs(t, poison.Wait(ctx), errFail)
		require.EqualValues(t, 50, poisonAttempts.Load())
	})
}

// No failure is silent: without a dead-letter function, a failed task is
// logged with its key and error.
func TestFailuresAreLoggedWithoutDeadLetter(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))
	s, err := New[string](WithLogger(logger))
	require.NoError(t, err)
	ctx := watchdog(t)
	c, err := s.Submit(ctx, "acct-42", func(context.Context) error { return errFail })
	require.NoError(t, err)
	require.ErrorIs(t, c.Wait(ctx), errFail)
	p, err := s.Submit(ctx, "acct-43", func(context.Context) error { panic("kaput") })
	require.NoError(t, err)
	var pe *PanicError
	require.ErrorAs(t, p.Wait(ctx), &pe)
	require.NoError(t, s.Close(ctx))
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	require.Contains(t, out, "key=acct-42")
	require.Contains(t, out, "attempt failed")
	require.Contains(t, out, "key=acct-43")
	require.Contains(t, out, "kaput")
	require.EqualValues(t, 2, s.Stats().DeadLettered)
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A panicking dead-letter function is recovered and logged; the key goes on.
func TestPanickingDeadLetterFunction(t *testing.T) {
	s := newSched[int](t, WithDeadLetter(func(DeadLetter[int]) { panic("dead letter broke") }))
	ctx := watchdog(t)
	c, err := s.Submit(ctx, 1, func(context.Context) error { return errFail })
	require.NoError(t, err)
	next, err := s.Submit(ctx, 1, func(context.Context) error { return nil })
	require.NoError(t, err)
	require.ErrorIs(t, c.Wait(ctx), errFail)
	require.NoError(t, next.Wait(ctx))
}

// Cancel during a backoff finishes the task at once and moves its key on;
// Close with an ended context aborts a task waiting out a backoff.
func TestCancelAndAbortDuringBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var dl recorder[int]
		s, err := New[int](WithLogger(quiet), WithDeadLetter(dl.fn),
			WithRetry(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Hour}))
		require.NoError(t, err)
		ctx := context.Background()
		c, err := s.Submit(ctx, 1, func(context.Context) error { return errFail })
		require.NoError(t, err)
		next, err := s.Submit(ctx, 1, func(context.Context) error { return nil })
		require.NoError(t, err)
		synctest.Wait()
		start := time.Now()
		c.Cancel()
		require.ErrorIs(t, c.Err(), context.Canceled)
		require.NoError(t, next.Wait(ctx))
		require.Equal(t, start, time.Now(), "the key moved on without waiting out the backoff")

		waiting, err := s.Submit(ctx, 2, func(context.Context) error { return errFail })
		require.NoError(t, err)
		behind, err := s.Submit(ctx, 2, func(context.Context) error { return nil })
		require.NoError(t, err)
		synctest.Wait()
		ended, cancel := context.WithCancel(ctx)
		cancel()
		err = s.Close(ended)
		require.ErrorIs(t, err, ErrAborted)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, waiting.Wait(ctx), ErrAborted)
		require.ErrorIs(t, behind.Wait(ctx), ErrAborted)
		synctest.Wait()
		st := s.Stats()
		require.EqualValues(t, 2, st.Aborted)
		require.EqualValues(t, 1, st.Cancelled)
		assertAccounting(t, st)
		require.Len(t, dl.all(), 2, "the aborted tasks reach the dead letter")
	})
}

// Under Park the key is parked before the dead letter is delivered, so the
// dead-letter function can act on it (here: skip it at once).
func TestParkedBeforeDeadLetterDelivery(t *testing.T) {
	var s *Scheduler[string]
	sawParked := make(chan bool, 1)
	s = newSched[string](t, WithFailurePolicy(Park), WithDeadLetter(func(dl DeadLetter[string]) {
		sawParked <- slices.Contains(s.Parked(), dl.Key)
		require.NoError(t, s.Skip(dl.Key))
	}))
	ctx := watchdog(t)
	bad, err := s.Submit(ctx, "k", func(context.Context) error { return errFail })
	require.NoError(t, err)
	next, err := s.Submit(ctx, "k", func(context.Context) error { return nil })
	require.NoError(t, err)
	require.True(t, <-sawParked)
	require.ErrorIs(t, bad.Wait(ctx), errFail)
	require.NoError(t, next.Wait(ctx))
	require.Empty(t, s.Parked())
}

// When Close gives up, Stats is settled by the time it returns (nothing is
// left running here), and Resume and Skip report ErrClosed.
func TestCloseAbortSettlesStats(t *testing.T) {
	for _, name := range []string{"parked", "backoff", "queued"} {
		t.Run(name, func(t *testing.T) {
			opts := []Option{WithLogger(quiet), WithWorkers(1)}
			switch name {
			case "parked":
				opts = append(opts, WithFailurePolicy(Park))
			case "backoff":
				opts = append(opts, WithRetry(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Hour}))
			}
			s, err := New[int](opts...)
			require.NoError(t, err)
			ctx := watchdog(t)
			gate := make(chan struct{})
			for k := range 5 {
				_, err := s.Submit(ctx, k, func(context.Context) error {
					if name == "queued" {
						<-gate
						return nil
					}
					return errFail
				})
				require.NoError(t, err)
				for range 3 {
					_, err := s.Submit(ctx, k, func(context.Context) error { return nil })
					require.NoError(t, err)
				}
			}
			if name != "queued" {
				for s.Stats().Retried+uint64(s.Stats().ParkedKeys) < 5 {
					require.NoError(t, ctx.Err())
					runtime.Gosched()
				}
			}
			ended, cancel := context.WithCancel(ctx)
			cancel()
			if name == "queued" {
				// The running head returns as Close gives up: only once Close
				// has started (closed before it, one worker can run all 20
				// tasks before Close looks, and Close has nothing to abort).
				go func() {
					for !s.pending.closed() {
						runtime.Gosched()
					}
					close(gate)
				}()
			}
			require.ErrorIs(t, s.Close(ended), ErrAborted)
			st := s.Stats()
			if st.Running == 0 {
				require.Zero(t, st.Pending, "%+v", st)
				require.Zero(t, st.Keys, "%+v", st)
				require.Zero(t, s.KeyDepth(0))
				assertAccounting(t, st)
			}
			require.ErrorIs(t, s.Resume(0), ErrClosed)
			require.ErrorIs(t, s.Skip(0), ErrClosed)
		})
	}
}

// Panics are not retried, unless WithRetryPanics.
func TestRetryPanicsOptIn(t *testing.T) {
	for _, optIn := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			opts := []Option{WithRetry(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second})}
			if optIn {
				opts = append(opts, WithRetryPanics())
			}
			s := newBubbleSched[int](t, opts...)
			var attempts atomic.Int32
			c, err := s.Submit(context.Background(), 1, func(ctx context.Context) error {
				if attempts.Add(1) < 3 {
					panic("flaky")
				}
				return nil
			})
			require.NoError(t, err)
			err = c.Wait(context.Background())
			if optIn {
				require.NoError(t, err)
				require.EqualValues(t, 3, attempts.Load())
				require.EqualValues(t, 2, s.Stats().Retried)
			} else {
				var pe *PanicError
				require.ErrorAs(t, err, &pe)
				require.EqualValues(t, 1, attempts.Load())
				require.EqualValues(t, 1, s.Stats().Panicked)
			}
		})
	}
}
