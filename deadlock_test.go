package keysched

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

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
	ctx := watchdog(t)
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
