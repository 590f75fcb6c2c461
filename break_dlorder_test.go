package keysched

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The dead letters of the tasks Close gives up on are delivered concurrently,
// but each key's in its order (WithDeadLetter's and Close's promise), also
// when the runners of the keys, whose running heads return on cancellation,
// abort the tasks behind them while Close's walk does too.
//
// It failed before the per-key lanes (every run, most keys out of order).
// Causes then: (1) a runner whose head returned on cancellation aborted the
// tasks behind it one by one, each dead letter its own batch, and up to 64
// deliverers took those batches concurrently; (2) Close's walk and such a
// runner took nodes of one chain in a race, each enqueueing its own batch;
// (3) a task that was running when the walk passed it (or a late-appended
// one) made its letter after the letters of the tasks behind it. Now an
// aborted task's letter goes to its key's lane (close.go's letterQueue) when
// the key passes it, one at a time per key, in chain order.
//
// Both with heads that return nil when cancelled and with heads that fail
// then (their own dead letter must come first on their key). It also checks
// that one key's letters are never delivered at once, and, with heads that
// return nil (no runner delivers), that at most min(workers, maxDeliverers)
// letters are delivered at once.
func TestBreakAbortDeadLetterOrderPerKey(t *testing.T) {
	const keys, depth = 16, 30
	for _, failHead := range []bool{false, true} {
		for iter := range 4 {
			t.Run(fmt.Sprintf("failHead=%v/%d", failHead, iter), func(t *testing.T) {
				abortOrderRun(t, keys, depth, failHead)
			})
		}
	}
}

func abortOrderRun(t *testing.T, keys, depth int, failHead bool) {
	var mu sync.Mutex
	seqOf := map[*Completion]int{} // 0: a key's head
	last := map[int]int{}
	count := map[int]int{}
	inKey := map[int]int{}
	inFlight, maxInFlight := 0, 0
	var bad []string
	s, err := New[int](WithLogger(quiet), WithWorkers(keys),
		WithDeadLetter(func(dl DeadLetter[int]) {
			c := dl.Context.(dlContext).c
			mu.Lock()
			seq := seqOf[c]
			if l, ok := last[dl.Key]; ok && seq <= l {
				bad = append(bad, fmt.Sprintf("key %d: dead letter of task %d after task %d's", dl.Key, seq, l))
			}
			last[dl.Key] = seq
			count[dl.Key]++
			inKey[dl.Key]++
			if inKey[dl.Key] > 1 {
				bad = append(bad, fmt.Sprintf("key %d: two dead letters delivered at once", dl.Key))
			}
			inFlight++
			maxInFlight = max(maxInFlight, inFlight)
			mu.Unlock()
			time.Sleep(10 * time.Microsecond) // a sink that takes a moment
			mu.Lock()
			inKey[dl.Key]--
			inFlight--
			mu.Unlock()
		}))
	require.NoError(t, err)
	ctx := watchdog(t)
	started := make(chan struct{}, keys)
	var all []*Completion
	for k := range keys {
		c, err := s.Submit(ctx, k, func(tctx context.Context) error {
			started <- struct{}{}
			<-tctx.Done()
			if failHead {
				return tctx.Err()
			}
			return nil
		})
		require.NoError(t, err)
		all = append(all, c)
	}
	for k := range keys {
		for i := 1; i <= depth; i++ {
			c, err := s.Submit(ctx, k, func(context.Context) error { return nil })
			require.NoError(t, err)
			mu.Lock()
			seqOf[c] = i
			mu.Unlock()
			all = append(all, c)
		}
	}
	for range keys {
		<-started
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, s.Close(cctx), ErrAborted)
	for _, c := range all {
		require.NoError(t, ctx.Err())
		<-c.Done()
	}
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, bad)
	want := depth
	if failHead {
		want++
	}
	for k := range keys {
		require.Equal(t, want, count[k], "key %d: dead letters", k)
	}
	if !failHead {
		require.LessOrEqual(t, maxInFlight, min(keys, maxDeliverers))
	}
}
