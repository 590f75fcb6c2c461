package keysched

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/panjf2000/ants/v2"
	"github.com/stretchr/testify/require"
)

// Two schedulers on one small shared pool (nonblocking or not): one gives up
// in Close with a backlog and running tasks while the other keeps working;
// the other loses nothing and drains, and the aborted one settles.
func TestBreakSharedPoolCloseGiveUp(t *testing.T) {
	for _, nonblocking := range []bool{false, true} {
		p, err := ants.NewPool(3, ants.WithNonblocking(nonblocking))
		require.NoError(t, err)
		a, err := New[int](WithLogger(quiet), WithPool(p), WithDeadLetter(func(DeadLetter[int]) {}))
		require.NoError(t, err)
		b, err := New[int](WithLogger(quiet), WithPool(p), WithMaxConcurrency(2))
		require.NoError(t, err)
		ctx := watchdog(t)
		release := make(chan struct{})
		var aAll []*Completion
		for k := range 4 {
			for range 50 {
				c, err := a.Submit(ctx, k, func(tctx context.Context) error {
					select {
					case <-release:
					case <-tctx.Done():
					}
					return nil
				})
				require.NoError(t, err)
				aAll = append(aAll, c)
			}
		}
		var ran atomic.Int64
		var wg sync.WaitGroup
		var bAll []*Completion
		var mu sync.Mutex
		for g := range 2 {
			wg.Go(func() {
				for i := range 300 {
					c, err := b.Submit(ctx, g*1000+i%7, func(context.Context) error { ran.Add(1); return nil })
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					bAll = append(bAll, c)
					mu.Unlock()
				}
			})
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		require.ErrorIs(t, a.Close(cctx), ErrAborted)
		wg.Wait()
		close(release)
		require.NoError(t, b.Drain(ctx))
		require.EqualValues(t, 600, ran.Load())
		for _, c := range append(aAll, bAll...) {
			select {
			case <-c.Done():
			case <-ctx.Done():
				t.Fatal("a Completion never done")
			}
		}
		sa := a.Stats()
		assertAccounting(t, sa)
		require.Zero(t, sa.Keys)
		require.NoError(t, b.Close(ctx))
		assertAccounting(t, b.Stats())
		p.Release()
	}
}
