package keysched

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/panjf2000/ants/v2"
	"github.com/stretchr/testify/require"
)

// maxTracker records the most tasks running at once.
type maxTracker struct {
	now, max atomic.Int32
}

func (m *maxTracker) enter() {
	n := m.now.Add(1)
	for {
		old := m.max.Load()
		if n <= old || m.max.CompareAndSwap(old, n) {
			return
		}
	}
}
func (m *maxTracker) leave() { m.now.Add(-1) }

// WithPool: several schedulers share one pool the caller owns; Close leaves
// it running; WithMaxConcurrency bounds each scheduler's share.
func TestSharedPoolAndMaxConcurrency(t *testing.T) {
	p, err := ants.NewPool(6)
	require.NoError(t, err)
	defer p.Release()
	ctx := watchdog(t)
	a := newSched[int](t, WithPool(p), WithMaxConcurrency(2))
	b := newSched[int](t, WithPool(p))
	var ma maxTracker
	gate := make(chan struct{})
	// a's tasks all block: it must never hold more than two workers.
	for k := range 10 {
		_, err := a.Submit(ctx, k, func(context.Context) error { ma.enter(); <-gate; ma.leave(); return nil })
		require.NoError(t, err)
	}
	// b's tasks finish on the other workers meanwhile.
	var cs []*Completion
	for k := range 200 {
		c, err := b.Submit(ctx, k%20, func(context.Context) error { return nil })
		require.NoError(t, err)
		cs = append(cs, c)
	}
	for _, c := range cs {
		require.NoError(t, c.Wait(ctx))
	}
	// a takes its two workers (it may not have yet when b is done).
	for a.Stats().Running < 2 {
		require.NoError(t, ctx.Err())
		runtimeYield()
	}
	require.EqualValues(t, 2, ma.max.Load())
	require.Equal(t, 2, a.Stats().Running)
	close(gate)
	require.NoError(t, a.Drain(ctx))
	require.NoError(t, a.Close(ctx))
	require.NoError(t, b.Close(ctx))
	require.False(t, p.IsClosed(), "Close released a pool it does not own")
	done := make(chan struct{})
	require.NoError(t, p.Submit(func() { close(done) }))
	<-done
}

// The scheduler's own pool: never more than WithWorkers tasks at once.
func TestWorkersBound(t *testing.T) {
	s := newSched[int](t, WithWorkers(3))
	ctx := watchdog(t)
	var m maxTracker
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for k := range 50 {
		wg.Add(1)
		_, err := s.Submit(ctx, k, func(context.Context) error {
			defer wg.Done()
			m.enter()
			<-gate
			m.leave()
			return nil
		})
		require.NoError(t, err)
	}
	for m.max.Load() < 3 {
		require.NoError(t, ctx.Err())
		runtimeYield()
	}
	close(gate)
	wg.Wait()
	require.EqualValues(t, 3, m.max.Load())
}

// A shared pool that is full of other work: submissions never wait for it,
// and the scheduler's tasks run once workers free up.
func TestSharedPoolFullOfOtherWork(t *testing.T) {
	for _, nonblocking := range []bool{false, true} {
		p, err := ants.NewPool(2, ants.WithNonblocking(nonblocking))
		require.NoError(t, err)
		ctx := watchdog(t)
		hold := make(chan struct{})
		var started sync.WaitGroup
		started.Add(2)
		for range 2 {
			require.NoError(t, p.Submit(func() { started.Done(); <-hold }))
		}
		started.Wait()
		s := newSched[int](t, WithPool(p))
		var cs []*Completion
		for k := range 20 {
			// Neither call waits for a worker of the full shared pool (if
			// one did, this loop would hang: the pool frees up only below).
			submit := s.TrySubmit
			if k%2 == 0 {
				submit = s.Submit
			}
			c, err := submit(ctx, k, func(context.Context) error { return nil })
			require.NoError(t, err)
			cs = append(cs, c)
		}
		close(hold)
		for _, c := range cs {
			require.NoError(t, c.Wait(ctx))
		}
		require.NoError(t, s.Close(ctx))
		p.Release()
	}
}

// A shared pool released by its owner while the scheduler has work: the work
// still runs (on plain goroutines), nothing hangs.
func TestSharedPoolReleasedUnderTheScheduler(t *testing.T) {
	p, err := ants.NewPool(1)
	require.NoError(t, err)
	ctx := watchdog(t)
	s := newSched[int](t, WithPool(p))
	gate := make(chan struct{})
	first, err := s.Submit(ctx, 1, func(context.Context) error { <-gate; return nil })
	require.NoError(t, err)
	var cs []*Completion
	for k := range 10 {
		c, err := s.Submit(ctx, k+2, func(context.Context) error { return nil })
		require.NoError(t, err)
		cs = append(cs, c)
	}
	p.Release()
	close(gate)
	require.NoError(t, first.Wait(ctx))
	for _, c := range cs {
		require.NoError(t, c.Wait(ctx))
	}
}

// Several schedulers on one pool submitting into each other from their tasks
// (with the task's context) do not deadlock, even on a one-worker pool.
func TestSchedulersSubmittingIntoEachOther(t *testing.T) {
	p, err := ants.NewPool(1)
	require.NoError(t, err)
	defer p.Release()
	ctx := watchdog(t)
	a := newSched[int](t, WithPool(p), WithMaxPending(8))
	b := newSched[int](t, WithPool(p), WithMaxPending(8))
	var ran atomic.Int64
	var hop func(from, to *Scheduler[int], left int) Task
	hop = func(from, to *Scheduler[int], left int) Task {
		return func(tctx context.Context) error {
			ran.Add(1)
			if left == 0 {
				return nil
			}
			_, err := to.Submit(tctx, left%3, hop(to, from, left-1))
			if err != nil { // fail fast, never wait (or the other one is closing)
				require.True(t, errors.Is(err, ErrKeyFull) || errors.Is(err, ErrFull) || errors.Is(err, ErrClosed), err)
			}
			return nil
		}
	}
	for i := range 20 {
		_, err := a.Submit(ctx, i%3, hop(a, b, 10))
		require.NoError(t, err)
	}
	require.NoError(t, a.Drain(ctx))
	require.NoError(t, b.Drain(ctx))
	require.NoError(t, a.Drain(ctx))
	require.Positive(t, ran.Load())
}

func runtimeYield() { runtimeGosched() }
