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
// It fails today (remove the Skip to see it: every run, most keys out of
// order). Causes: (1) a runner whose head returned on cancellation aborts
// the tasks behind it one by one in step, each dead letter its own
// deliverLater batch, and up to 64 deliverers take those batches
// concurrently; (2) Close's walk and such a runner take nodes of one chain
// in a race, each enqueueing its own batch; (3) a task that was running when
// the walk passed it (or a late-appended one, abortNode) makes its letter
// after the letters of the tasks behind it are queued. A fix needs the
// aborted tasks' letters of one key delivered in one lane, in chain order:
// for instance, queued to a per-key lane by whoever passes them on the key
// (the runner, or settle; one at a time per key, in chain order), after the
// head's own letter, instead of by the walk. Since main's passage hold
// (bf54049) such a task is done only once passed anyway, so delivering its
// letter at its passage delays no Completion.
func TestBreakAbortDeadLetterOrderPerKey(t *testing.T) {
	t.Skip("known bug: the dead letters of aborted tasks of one key are delivered out of order (see the comment)")
	const keys, depth = 16, 30
	for iter := range 4 {
		t.Run(fmt.Sprint(iter), func(t *testing.T) {
			var mu sync.Mutex
			seqOf := map[*Completion]int{}
			last := map[int]int{}
			var bad []string
			s, err := New[int](WithLogger(quiet), WithWorkers(keys),
				WithDeadLetter(func(dl DeadLetter[int]) {
					c := dl.Context.(dlContext).c
					mu.Lock()
					seq := seqOf[c]
					if seq <= last[dl.Key] {
						bad = append(bad, fmt.Sprintf("key %d: dead letter of task %d after task %d's", dl.Key, seq, last[dl.Key]))
					}
					last[dl.Key] = seq
					mu.Unlock()
					time.Sleep(10 * time.Microsecond) // a sink that takes a moment
				}))
			require.NoError(t, err)
			ctx := watchdog(t)
			started := make(chan struct{}, keys)
			var all []*Completion
			for k := range keys {
				c, err := s.Submit(ctx, k, func(tctx context.Context) error {
					started <- struct{}{}
					<-tctx.Done()
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
		})
	}
}
