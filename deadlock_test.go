// Deadlock detection: Completion.Wait with a task's context fails with
// ErrDeadlock for a wait that could never end, and only then.

package keysched

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Waits that can never end (issue 8, class 2).

// A task submits a task on its own key with its context and waits for it:
// the new task is behind it. Wait fails at once with ErrDeadlock.
func TestWaitOnOwnKeyLaterTask(t *testing.T) {
	s := newSched[string](t, WithWorkers(2))
	ctx := watchdog(t)
	for name, via := range map[string]func(context.Context) context.Context{
		"task context":    func(c context.Context) context.Context { return c },
		"derived context": func(c context.Context) context.Context { return context.WithValue(c, ctxKey("k"), 1) },
	} {
		t.Run(name, func(t *testing.T) {
			c, err := s.Submit(ctx, "A", func(tctx context.Context) error {
				wctx := via(tctx)
				later, err := s.Submit(wctx, "A", func(context.Context) error { return nil })
				if err != nil {
					return err
				}
				return later.Wait(wctx)
			})
			require.NoError(t, err)
			require.ErrorIs(t, c.Wait(ctx), ErrDeadlock)
			require.NoError(t, s.Drain(ctx))
		})
	}
	t.Run("itself", func(t *testing.T) {
		self := make(chan *Completion, 1)
		c, err := s.Submit(ctx, "A", func(tctx context.Context) error { return (<-self).Wait(tctx) })
		require.NoError(t, err)
		self <- c
		require.ErrorIs(t, c.Wait(ctx), ErrDeadlock)
	})
	t.Run("from the dead-letter function", func(t *testing.T) {
		got := make(chan error, 1)
		var s2 *Scheduler[string]
		s2 = newSched[string](t, WithDeadLetter(func(dl DeadLetter[string]) {
			later, err := s2.Submit(dl.Context, dl.Key, func(context.Context) error { return nil })
			if err == nil {
				err = later.Wait(dl.Context)
			}
			got <- err
		}))
		_, err := s2.Submit(ctx, "A", func(context.Context) error { return errFail })
		require.NoError(t, err)
		require.ErrorIs(t, <-got, ErrDeadlock)
	})
}

// ring starts, on keys 0..n-1 (n workers), a task per key that submits a
// task on the next key and waits for it, once all n are running: a cycle of
// n waits. Exactly the wait that closes the cycle fails (or, if two close it
// at the same instant, both); the others then finish.
func ring(t *testing.T, scheds []*Scheduler[int], n int) []error {
	// A ring settles in milliseconds: 10 s is a bound, not a timing
	// assertion, so a wait that never ends fails the round by name.
	ctx := hangGuard(t, 10*time.Second)
	var ready sync.WaitGroup
	ready.Add(n)
	start := make(chan struct{})
	var blockers []*Completion // one per key, holding it until the ring is set
	for k := range n {
		b, err := scheds[k%len(scheds)].Submit(ctx, k, func(context.Context) error { <-start; return nil })
		require.NoError(t, err)
		blockers = append(blockers, b)
	}
	cs := make([]*Completion, n)
	for k := range n {
		s, next := scheds[k%len(scheds)], scheds[(k+1)%len(scheds)]
		var err error
		cs[k], err = s.Submit(ctx, k, func(tctx context.Context) error {
			// Queued behind the next key's own waiter: can run only after it.
			c, err := next.Submit(tctx, (k+1)%n, func(context.Context) error { return nil })
			if err != nil {
				return err
			}
			ready.Done()
			ready.Wait() // every key's waiter is running: the ring is set
			return c.Wait(tctx)
		})
		require.NoError(t, err)
	}
	close(start)
	errs := make([]error, n)
	for k, c := range cs {
		errs[k] = c.Wait(ctx)
		require.NotErrorIs(t, errs[k], context.DeadlineExceeded, "a wait never ended")
	}
	for _, b := range blockers {
		require.NoError(t, b.Wait(ctx))
	}
	return errs
}

func TestWaitCycleDetected(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		t.Run(fmt.Sprint(n, " keys"), func(t *testing.T) {
			for range 20 {
				s := newSched[int](t, WithWorkers(n+1))
				errs := ring(t, []*Scheduler[int]{s}, n)
				deadlocked := 0
				for _, err := range errs {
					if errors.Is(err, ErrDeadlock) {
						deadlocked++
					} else {
						require.NoError(t, err)
					}
				}
				require.GreaterOrEqual(t, deadlocked, 1, "%v", errs)
			}
		})
	}
	t.Run("across schedulers", func(t *testing.T) {
		a, b := newSched[int](t, WithWorkers(3)), newSched[int](t, WithWorkers(3))
		for range 20 {
			errs := ring(t, []*Scheduler[int]{a, b}, 4)
			var deadlocked int
			for _, err := range errs {
				if errors.Is(err, ErrDeadlock) {
					deadlocked++
				}
			}
			require.GreaterOrEqual(t, deadlocked, 1, "%v", errs)
		}
	})
}

// Waits along a chain of keys (no cycle) are allowed, however the heads move
// while others walk them: key i's tasks wait for a task on key i+1, whose
// tasks wait on key i+2, ...; many at once.
func TestAcyclicWaitsAllowed(t *testing.T) {
	s := newSched[int](t, WithWorkers(8))
	ctx := watchdog(t)
	const depth, roots = 4, 300
	var task func(level int) Task
	task = func(level int) Task {
		return func(tctx context.Context) error {
			if level == depth {
				return nil
			}
			c, err := s.Submit(tctx, level+1, task(level+1))
			if err != nil {
				return err
			}
			return c.Wait(tctx)
		}
	}
	var deadlocks atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range roots / 4 {
				c, err := s.Submit(ctx, 0, task(0))
				if err != nil {
					t.Error(err)
					return
				}
				if err := c.Wait(ctx); errors.Is(err, ErrDeadlock) {
					deadlocks.Add(1)
				} else if err != nil && !errors.Is(err, ErrKeyFull) {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, deadlocks.Load())
	// And a plain wait on another key's runnable task, outside any cycle.
	c, err := s.Submit(ctx, 100, func(tctx context.Context) error {
		other, err := s.Submit(tctx, 101, func(context.Context) error { return nil })
		if err != nil {
			return err
		}
		return other.Wait(tctx)
	})
	require.NoError(t, err)
	require.NoError(t, c.Wait(ctx))
}

// waitingRec reports whether the task of c has a registered wait.
func waitingRec(c *Completion) bool {
	x := c.more.Load()
	return x != nil && x.waiting.Load() != nil
}

// Found by attacking the code (adversarial review, 2026-11-30, with the change
// for waits on tasks Cancel or Close's abort has taken, commit e5adb25).
//
// A task that Close left running waits (with its context made
// uncancellable) for a later task of its own key, which Close aborted: that
// task is done only once its key has passed it (after the waiter), so the
// wait is refused with ErrDeadlock, never hangs.
func TestWaitOnAbortedLaterTaskOfOwnKeyIsDeadlock(t *testing.T) {
	s, err := New[int](WithLogger(quiet), WithWorkers(2), WithDeadLetter(func(DeadLetter[int]) {}))
	require.NoError(t, err)
	ctx := watchdog(t)
	started, goWait := make(chan struct{}), make(chan struct{})
	result := make(chan error, 1)
	var later *Completion
	head, err := s.Submit(ctx, 1, func(tctx context.Context) error {
		close(started)
		<-goWait // ignores its cancelled context
		result <- later.Wait(context.WithoutCancel(tctx))
		return nil
	})
	require.NoError(t, err)
	later, err = s.Submit(ctx, 1, func(context.Context) error { return nil })
	require.NoError(t, err)
	<-started
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	var ce *CloseError
	require.ErrorAs(t, s.Close(cctx), &ce)
	close(goWait)
	select {
	case err := <-result:
		require.ErrorIs(t, err, ErrDeadlock)
	case <-time.After(10 * time.Second): // a watchdog: the wait hangs
		t.Fatal("the wait for an aborted later task of its own key hangs")
	}
	require.NoError(t, head.Wait(ctx))
	require.ErrorIs(t, later.Wait(ctx), ErrAborted)
}

// Found by attacking the code (adversarial review, 2026-11-30, with the change
// for waits on tasks Cancel or Close's abort has taken, commit e5adb25).
//
// A cycle through tasks Close aborted: T (key 1) and H (key 2) run on after
// Close gave up (uncancellable waits); H waits for a2, queued behind T, and
// T then waits for b2, queued behind H. Both a2 and b2 are aborted but done
// only once their keys pass them: the cycle is real and must be reported.
func TestWaitCycleThroughAbortedTasksDetected(t *testing.T) {
	s, err := New[int](WithLogger(quiet), WithWorkers(3), WithDeadLetter(func(DeadLetter[int]) {}))
	require.NoError(t, err)
	ctx := watchdog(t)
	var a2, b2 *Completion
	tStarted, tGo := make(chan struct{}), make(chan struct{})
	hGo := make(chan struct{})
	tRes, hRes := make(chan error, 1), make(chan error, 1)
	tc, err := s.Submit(ctx, 1, func(tctx context.Context) error {
		close(tStarted)
		<-tGo
		tRes <- b2.Wait(context.WithoutCancel(tctx))
		return nil
	})
	require.NoError(t, err)
	a2, err = s.Submit(ctx, 1, func(context.Context) error { return nil })
	require.NoError(t, err)
	hc, err := s.Submit(ctx, 2, func(hctx context.Context) error {
		<-hGo
		hRes <- a2.Wait(context.WithoutCancel(hctx))
		return nil
	})
	require.NoError(t, err)
	b2, err = s.Submit(ctx, 2, func(context.Context) error { return nil })
	require.NoError(t, err)
	<-tStarted
	close(hGo)
	for !waitingRec(hc) {
		time.Sleep(100 * time.Microsecond) // polling pace
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, s.Close(cctx), ErrAborted)
	close(tGo)
	select {
	case err := <-tRes:
		require.ErrorIs(t, err, ErrDeadlock)
	case <-time.After(10 * time.Second): // a watchdog: the cycle hangs
		t.Fatal("a cycle through aborted tasks hangs")
	}
	require.ErrorIs(t, <-hRes, ErrAborted) // T returned: key 1 passed a2
	require.NoError(t, tc.Wait(ctx))
	require.NoError(t, hc.Wait(ctx))
	require.ErrorIs(t, b2.Wait(ctx), ErrAborted)
}

// Found by attacking the code (adversarial review, 2026-11-30): it reproduces a
// known false positive (documented on ErrDeadlock) and skips when it sees it.
//
// A task (key 2) whose own goroutine waits, with the task's context, for a
// task queued behind a running task T (key 1), while the task itself just
// waits for a gate: T's wait for it is not a deadlock (it ends when the gate
// opens).
func TestWaitByATasksOwnGoroutineIsNoCycle(t *testing.T) {
	s := newSched[int](t, WithWorkers(3))
	ctx := watchdog(t)
	tGo := make(chan struct{})
	result := make(chan error, 1)
	var h *Completion
	tc, err := s.Submit(ctx, 1, func(tctx context.Context) error {
		<-tGo
		result <- h.Wait(tctx)
		return nil
	})
	require.NoError(t, err)
	x, err := s.Submit(ctx, 1, func(context.Context) error { return nil })
	require.NoError(t, err)
	release := make(chan struct{})
	h, err = s.Submit(ctx, 2, func(hctx context.Context) error {
		go func() { _ = x.Wait(hctx) }() // ends when h returns, at the latest
		<-release
		return nil
	})
	require.NoError(t, err)
	for !waitingRec(h) {
		time.Sleep(100 * time.Microsecond) // polling pace
	}
	close(tGo)
	for released := false; ; {
		select {
		case err := <-result:
			if errors.Is(err, ErrDeadlock) {
				close(release)
				t.Skip("known false positive: a wait made by a task's own goroutine counts as the task's: " + err.Error())
			}
			require.NoError(t, err)
			require.NoError(t, tc.Wait(ctx))
			return
		default:
		}
		if !released && waitingRec(tc) {
			released = true
			close(release)
		}
		time.Sleep(100 * time.Microsecond) // polling pace
	}
}

// Written to attack the code (adversarial review, 2026-11-30); it held: the
// cycle was found, nothing hung.
//
// A cycle closed through a dead-letter function's wait (with
// DeadLetter.Context): task A (key 1) fails, its dead-letter function waits
// for b2 (queued behind B on key 2) while B waits for a2 (queued behind A).
// Neither wait can end: at least one must fail with ErrDeadlock, none hang.
func TestWaitCycleThroughDeadLetterDetected(t *testing.T) {
	for range 20 {
		var b2, a2 *Completion
		ready := make(chan struct{})
		dlErr := make(chan error, 1)
		s := newSched[int](t, WithWorkers(3), WithDeadLetter(func(dl DeadLetter[int]) {
			if dl.Key == 1 {
				<-ready
				dlErr <- b2.Wait(dl.Context)
			}
		}))
		ctx := watchdog(t)
		bStarted := make(chan struct{})
		a, err := s.Submit(ctx, 1, func(context.Context) error { <-bStarted; return errors.New("fail") })
		require.NoError(t, err)
		a2, err = s.Submit(ctx, 1, func(context.Context) error { return nil })
		require.NoError(t, err)
		bErr := make(chan error, 1)
		b, err := s.Submit(ctx, 2, func(tctx context.Context) error {
			close(bStarted)
			<-ready
			bErr <- a2.Wait(tctx)
			return nil
		})
		require.NoError(t, err)
		b2, err = s.Submit(ctx, 2, func(context.Context) error { return nil })
		require.NoError(t, err)
		close(ready)
		var errs []error
		for range 2 {
			select {
			case e := <-dlErr:
				errs = append(errs, e)
			case e := <-bErr:
				errs = append(errs, e)
			case <-ctx.Done():
				t.Fatal("a cycle through a dead-letter function's wait hangs")
			}
		}
		require.True(t, errors.Is(errs[0], ErrDeadlock) || errors.Is(errs[1], ErrDeadlock), "%v", errs)
		_ = a.Wait(ctx)
		require.NoError(t, b.Wait(ctx))
	}
}
