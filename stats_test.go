// Observation by Stats: each outcome counted once, when its Completion is
// done, and the counters settled after Close. (The Observer, task ages and
// Keys are observe_test.go.)

package keysched

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Counters behind completions (issue 8, class 3): once a Completion is done,
// Stats counts its outcome; once Drain or Close returned and nothing runs,
// Stats is settled; a Completion is done only once its dead letter, if it has
// one, was delivered, on every path.

// A watcher polls Done and reads Stats the moment it sees the task done.
func TestStatsCountsOutcomeOnceDone(t *testing.T) {
	s := newSched[int](t, WithWorkers(4))
	ctx := watchdog(t)
	const n = 4000
	for i := range n {
		var task Task
		switch i % 3 {
		case 0:
			task = func(context.Context) error { return nil }
		case 1:
			task = func(context.Context) error { return errFail }
		default:
			task = func(context.Context) error { panic("boom") }
		}
		c, err := s.Submit(ctx, i%7, task)
		require.NoError(t, err)
		done := c.Done()
	poll:
		for {
			select {
			case <-done:
				break poll
			default: //nolint:staticcheck // SA5004: spinning is the point: no wake-up may help the check
			}
		}
		st := s.Stats()
		require.EqualValues(t, i+1, st.Succeeded+st.Failed+st.Panicked, "task %d done but not counted: %+v", i, st)
		want := uint64(i/3 + 1)
		got := [...]uint64{st.Succeeded, st.Failed, st.Panicked}[i%3]
		require.Equal(t, want, got, "task %d: %+v", i, st)
	}
}

// The aborting Close of the issue: a 3 ms deadline, 100 one-millisecond tasks
// on 100 keys, 10 workers. Close returns while some still run (they ignore
// their context); once every Completion is done, Stats is settled.
func TestStatsSettledAfterAbortingCloseAndCompletions(t *testing.T) {
	rounds := 150
	if testing.Short() {
		rounds = 20
	}
	for range rounds {
		s, err := New[int](WithLogger(quiet), WithWorkers(10))
		require.NoError(t, err)
		ctx := watchdog(t)
		cs := make([]*Completion, 100)
		for k := range cs {
			cs[k], err = s.Submit(ctx, k, func(context.Context) error {
				time.Sleep(time.Millisecond) // the work; it ignores its context
				return nil
			})
			require.NoError(t, err)
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Millisecond)
		err = s.Close(cctx)
		cancel()
		if err != nil {
			require.ErrorIs(t, err, ErrAborted)
		}
		for _, c := range cs {
			<-c.Done()
		}
		st := s.Stats()
		require.Zero(t, st.Pending, "%+v", st)
		require.Zero(t, st.Keys, "%+v", st)
		require.Zero(t, st.Running, "%+v", st)
		assertAccounting(t, st)
	}
}

// Close gives up while tasks run that ignore their context, with aborted
// tasks queued behind them on their keys: once the running tasks'
// Completions are done, the aborted tasks behind them are no longer counted.
func TestStatsSettledBehindTasksCloseLeftRunning(t *testing.T) {
	for range 50 {
		s, err := New[int](WithLogger(quiet), WithWorkers(4))
		require.NoError(t, err)
		ctx := watchdog(t)
		gate := make(chan struct{})
		started := make(chan struct{}, 4)
		var running, all []*Completion
		for k := range 4 {
			c, err := s.Submit(ctx, k, func(context.Context) error {
				started <- struct{}{}
				<-gate
				return nil
			})
			require.NoError(t, err)
			running = append(running, c)
			all = append(all, c)
			for range 3 {
				c, err := s.Submit(ctx, k, func(context.Context) error { return nil })
				require.NoError(t, err)
				all = append(all, c)
			}
		}
		for range 4 {
			<-started
		}
		ended, cancel := context.WithCancel(ctx)
		cancel()
		require.ErrorIs(t, s.Close(ended), ErrAborted)
		close(gate)
		for _, c := range running {
			require.NoError(t, c.Wait(ctx))
		}
		for _, c := range all { // the aborted ones: done once dead-lettered
			_ = c.Wait(ctx)
		}
		st := s.Stats()
		require.Zero(t, st.Pending, "%+v", st)
		require.Zero(t, st.Keys, "%+v", st)
		assertAccounting(t, st)
	}
}

// The striped counter sums exactly what was added, from any goroutines, and
// goroutines spread over its stripes.
func TestCounter(t *testing.T) {
	c := newCounter()
	var wg sync.WaitGroup
	used := make([]bool, len(c.stripes))
	var mu sync.Mutex
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			used[c.stripe()] = true
			mu.Unlock()
			for i := range 1000 {
				c.Add(int64(g))
				if i%2 == 0 {
					c.Inc()
				} else {
					c.Dec()
				}
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 1000*(15*16/2), c.Value())
	n := 0
	for _, u := range used {
		if u {
			n++
		}
	}
	require.Greater(t, n, 1, "16 goroutines on one stripe")
}

// Stats.Rejected counts every TrySubmit (and Submit) call that returned an
// error, whichever bound refused it: the key's depth (ErrKeyFull), the
// pending bound (ErrFull), a closed scheduler (ErrClosed).
func TestStatsRejectedCountsEveryRefusedTrySubmit(t *testing.T) {
	s, err := New[int](WithLogger(quiet), WithMaxKeyDepth(1), WithMaxPending(2))
	require.NoError(t, err)
	ctx := watchdog(t)
	gate := make(chan struct{})
	hold := func(context.Context) error { <-gate; return nil }
	_, err = s.Submit(ctx, 1, hold)
	require.NoError(t, err)
	_, err = s.TrySubmit(ctx, 1, hold)
	require.ErrorIs(t, err, ErrKeyFull)
	require.EqualValues(t, 1, s.Stats().Rejected, "TrySubmit on a full key")
	_, err = s.Submit(ctx, 2, hold)
	require.NoError(t, err)
	_, err = s.TrySubmit(ctx, 3, hold)
	require.ErrorIs(t, err, ErrFull)
	require.EqualValues(t, 2, s.Stats().Rejected, "TrySubmit on a full scheduler")
	close(gate)
	require.NoError(t, s.Close(ctx))
	_, err = s.TrySubmit(ctx, 1, hold)
	require.ErrorIs(t, err, ErrClosed)
	st := s.Stats()
	require.EqualValues(t, 3, st.Rejected, "TrySubmit after Close")
	require.EqualValues(t, 2, st.Submitted, "no refused task was accepted")
}
