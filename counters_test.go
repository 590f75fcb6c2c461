package keysched

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
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

// parkedWithSlowDeadLetter parks key "k" whose dead-letter function blocks
// until release is closed; it returns the parked task's Completion once the
// function has started.
func parkedWithSlowDeadLetter(t *testing.T, fn func(*Scheduler[string], DeadLetter[string])) (*Scheduler[string], *Completion, func()) {
	t.Helper()
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	entered := make(chan struct{})
	var s *Scheduler[string]
	s, err := New[string](WithLogger(quiet), WithFailurePolicy(Park), WithDeadLetter(func(dl DeadLetter[string]) {
		if !errors.Is(dl.Err, errFail) {
			return // the second letter, with ErrAborted, of the Close case
		}
		close(entered)
		if fn != nil {
			fn(s, dl)
		}
		<-gate
	}))
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := s.Close(watchdog(t)); err != nil {
			require.ErrorIs(t, err, ErrAborted) // the abort case closed it so
		}
	})
	t.Cleanup(release) // first, if the test failed before it released it
	c, err := s.Submit(watchdog(t), "k", func(context.Context) error { return errFail })
	require.NoError(t, err)
	<-entered
	return s, c, release
}

func requireNotDone(t *testing.T, c *Completion) {
	t.Helper()
	select {
	case <-c.Done():
		t.Fatalf("Completion done while its dead letter is still being delivered (Err %v)", c.Err())
	default:
	}
	require.NoError(t, c.Err())
}

// Park then Skip (from elsewhere, or from the dead-letter function itself):
// the Completion is done only once the dead letter was delivered.
func TestSkipDoneOnlyAfterDeadLetter(t *testing.T) {
	t.Run("concurrent", func(t *testing.T) {
		s, c, release := parkedWithSlowDeadLetter(t, nil)
		require.NoError(t, s.Skip("k"))
		requireNotDone(t, c)
		release()
		require.ErrorIs(t, c.Wait(watchdog(t)), errFail)
	})
	t.Run("from the dead-letter function", func(t *testing.T) {
		skipped := make(chan error, 1)
		_, c, release := parkedWithSlowDeadLetter(t, func(s *Scheduler[string], dl DeadLetter[string]) {
			skipped <- s.Skip(dl.Key)
		})
		require.NoError(t, <-skipped)
		requireNotDone(t, c)
		release()
		require.ErrorIs(t, c.Wait(watchdog(t)), errFail)
	})
}

// Park then Resume: the resumed run succeeds while the first dead letter is
// still being delivered; the Completion waits for the delivery.
func TestResumeDoneOnlyAfterDeadLetter(t *testing.T) {
	var s *Scheduler[string]
	release := make(chan struct{})
	entered := make(chan struct{})
	ran := make(chan struct{})
	s = newSched[string](t, WithFailurePolicy(Park), WithDeadLetter(func(dl DeadLetter[string]) {
		close(entered)
		<-release
	}))
	ctx := watchdog(t)
	first := true
	c, err := s.Submit(ctx, "k", func(context.Context) error {
		if first {
			first = false
			return errFail
		}
		close(ran)
		return nil
	})
	require.NoError(t, err)
	<-entered
	require.NoError(t, s.Resume("k"))
	<-ran
	// The resumed run has returned; its runner finishes it and passes the
	// key. The key drains (the chain has nothing more), so wait for that.
	require.True(t, waitFor(ctx, func() bool { return s.KeyDepth("k") == 0 }))
	requireNotDone(t, c)
	close(release)
	require.NoError(t, c.Wait(ctx))
	require.NoError(t, s.Drain(ctx))
	st := s.Stats()
	require.EqualValues(t, 1, st.Succeeded)
	assertAccounting(t, st)
}

// Park then Cancel, and Park then Close's abort: done only once the dead
// letter of the failure was delivered.
func TestCancelAndAbortOfParkedDoneOnlyAfterDeadLetter(t *testing.T) {
	t.Run("cancel", func(t *testing.T) {
		_, c, release := parkedWithSlowDeadLetter(t, nil)
		c.Cancel()
		requireNotDone(t, c)
		release()
		require.ErrorIs(t, c.Wait(watchdog(t)), context.Canceled)
	})
	t.Run("abort", func(t *testing.T) {
		s, c, release := parkedWithSlowDeadLetter(t, nil)
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		closed := make(chan error, 1)
		go func() { closed <- s.Close(ended) }()
		// Close gives up on the parked task: wait until it was taken.
		require.True(t, waitFor(watchdog(t), func() bool { return s.Stats().Aborted == 1 }))
		requireNotDone(t, c)
		release()
		require.ErrorIs(t, c.Wait(watchdog(t)), ErrAborted)
		require.ErrorIs(t, <-closed, ErrAborted)
	})
}

// A task Close's abort takes while it waits in its key's chain (here: keys
// whose heads wait for the one busy worker) is done only once its key has
// moved past it, as well as after its dead letter: a watcher that sees its
// Completion done finds the key no longer holding it, while Close still runs.
func TestAbortedTaskDoneOnlyOnceItsKeyMovedOn(t *testing.T) {
	const keys = 20_000
	s, err := New[int](WithLogger(quiet), WithWorkers(1), WithMaxPending(keys+1), WithDeadLetter(func(DeadLetter[int]) {}))
	require.NoError(t, err)
	ctx := watchdog(t)
	gate, started := make(chan struct{}), make(chan struct{})
	_, err = s.Submit(ctx, -1, func(context.Context) error { close(started); <-gate; return nil })
	require.NoError(t, err)
	<-started
	cs := make([]*Completion, keys)
	for k := range keys {
		cs[k], err = s.Submit(ctx, k, func(context.Context) error { return nil })
		require.NoError(t, err)
	}
	var bad atomic.Int64
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for k, c := range cs {
			<-c.Done()
			if s.KeyDepth(k) != 0 {
				bad.Add(1)
			}
		}
	}()
	ended, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, s.Close(ended), ErrAborted)
	<-watched
	close(gate)
	require.Zero(t, bad.Load(), "aborted tasks done while their keys still held them")
}
