package keysched

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A Close that overruns its deadline (issue 8, class 4): Close returns within
// CloseGrace of giving up whatever the backlog, reports what it could not
// finish in a *CloseError, and loses nothing.

// closeBacklog queues total tasks over keys keys on 32 workers, every one
// blocking on gate (ignoring its context), with eight submitters still
// calling; Close gets a context that ends after 20ms. It returns Close's
// error, how long after the deadline Close returned, the Completions, and the
// number of dead letters delivered.
func closeBacklog(t *testing.T, total, keys int, dl func(DeadLetter[int]), gate chan struct{}) (error, time.Duration, []*Completion) {
	t.Helper()
	s, err := New[int](WithLogger(quiet), WithWorkers(32), WithMaxPending(total+1), WithMaxKeyDepth(total/keys+1), WithDeadLetter(dl))
	require.NoError(t, err)
	ctx := watchdog(t)
	task := func(context.Context) error { <-gate; return nil }
	cs := make([]*Completion, 0, total)
	for i := range total {
		c, err := s.TrySubmit(ctx, i%keys, task)
		require.NoError(t, err)
		cs = append(cs, c)
	}
	// The 32 workers are busy with blocked tasks before Close begins.
	require.True(t, waitFor(ctx, func() bool { return s.Stats().Running == 32 }))
	var submitters sync.WaitGroup
	var mu sync.Mutex
	stopSubmitters := make(chan struct{})
	for g := range 8 {
		submitters.Go(func() {
			for {
				select {
				case <-stopSubmitters:
					return
				default:
				}
				c, err := s.TrySubmit(ctx, keys+g, task)
				if errors.Is(err, ErrClosed) {
					return
				}
				if err == nil {
					mu.Lock()
					cs = append(cs, c)
					mu.Unlock()
				}
			}
		})
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	cerr := s.Close(cctx)
	returned := time.Now()
	deadline, _ := cctx.Deadline()
	close(stopSubmitters)
	submitters.Wait()
	return cerr, returned.Sub(deadline), cs
}

func TestCloseWith100000QueuedTasks(t *testing.T) {
	const total, keys = 100_000, 1000
	t.Run("dead-letter function blocked", func(t *testing.T) {
		gate, dlGate := make(chan struct{}), make(chan struct{})
		var letters atomic.Int64
		cerr, overrun, cs := closeBacklog(t, total, keys, func(DeadLetter[int]) { <-dlGate; letters.Add(1) }, gate)
		// It returned (no dead letter could be delivered, the running tasks
		// are blocked): what it left is in its error.
		t.Logf("Close returned %v after its context's deadline (CloseGrace %v): %v", overrun, CloseGrace, cerr)
		require.ErrorIs(t, cerr, ErrAborted)
		require.ErrorIs(t, cerr, context.DeadlineExceeded)
		var ce *CloseError
		require.ErrorAs(t, cerr, &ce)
		require.GreaterOrEqual(t, ce.Running, 32, "%+v", ce)
		require.GreaterOrEqual(t, ce.Undelivered, 1, "%+v", ce)
		require.LessOrEqual(t, ce.NotRun+ce.Unreached, len(cs), "%+v", ce)
		require.Zero(t, letters.Load())
		for _, c := range cs[:total] { // run (blocked) or aborted (letter blocked)
			select {
			case <-c.Done():
				t.Fatalf("a task done: %v, before it returned or its dead letter was delivered", c.Err())
			default:
			}
		}
		// Nothing is lost: release the letters and the tasks.
		close(dlGate)
		close(gate)
		checkAllAccounted(t, cs, &letters, ce)
	})
	t.Run("dead-letter function quick", func(t *testing.T) {
		gate := make(chan struct{})
		var letters atomic.Int64
		n := total
		if testing.Short() || raceEnabled {
			n = total / 10 // keeps the suite's time under the race detector
		}
		cerr, overrun, cs := closeBacklog(t, n, keys, func(DeadLetter[int]) { letters.Add(1) }, gate)
		t.Logf("Close returned %v after its context's deadline (CloseGrace %v): %v", overrun, CloseGrace, cerr)
		var ce *CloseError
		require.ErrorAs(t, cerr, &ce)
		require.ErrorIs(t, cerr, ErrAborted)
		require.GreaterOrEqual(t, ce.Running, 32, "%+v", ce)
		close(gate)
		checkAllAccounted(t, cs, &letters, ce)
	})
}

// checkAllAccounted waits for every Completion: each task ran (succeeded) or
// was aborted and dead-lettered exactly once; the counts Close reported are
// within the final ones.
func checkAllAccounted(t *testing.T, cs []*Completion, letters *atomic.Int64, ce *CloseError) {
	t.Helper()
	ctx := watchdog(t)
	var ok, aborted int
	for _, c := range cs {
		switch err := c.Wait(ctx); {
		case err == nil:
			ok++
		case errors.Is(err, ErrAborted):
			aborted++
		default:
			t.Fatalf("outcome %v", err)
		}
	}
	require.GreaterOrEqual(t, ok, 32, "the running tasks ran")
	require.LessOrEqual(t, ok, 32+8, "only the running tasks ran")
	// Every aborted task's Completion is done only after its letter was
	// delivered, so all letters are in.
	require.EqualValues(t, aborted, letters.Load())
	require.LessOrEqual(t, ce.NotRun, aborted)
	require.LessOrEqual(t, ce.Undelivered, aborted)
}

// Close's own error, as returned by a later Close and through errors.As, for
// a Close that gave up with nothing left over.
func TestCloseErrorShape(t *testing.T) {
	s, err := New[int](WithLogger(quiet), WithWorkers(1))
	require.NoError(t, err)
	ctx := watchdog(t)
	gate := make(chan struct{})
	started := make(chan struct{})
	_, err = s.Submit(ctx, 1, func(tctx context.Context) error { close(started); <-tctx.Done(); <-gate; return tctx.Err() })
	require.NoError(t, err)
	for range 5 {
		_, err = s.Submit(ctx, 1, func(context.Context) error { return nil })
		require.NoError(t, err)
	}
	<-started
	ended, cancel := context.WithCancel(ctx)
	cancel()
	cerr := s.Close(ended)
	var ce *CloseError
	require.ErrorAs(t, cerr, &ce)
	// All five aborted (unless the machine starved the abort's walk for all
	// of CloseGrace: then those it had not reached are counted so).
	require.Equal(t, 5, ce.NotRun+ce.Unreached, "%+v", ce)
	require.Equal(t, 1, ce.Running)
	require.ErrorIs(t, cerr, context.Canceled)
	require.ErrorIs(t, cerr, ErrAborted)
	require.Contains(t, cerr.Error(), "accepted tasks did not run") // the text: TestCloseErrorTextIsOneSentence
	close(gate)
	require.Equal(t, cerr, s.Close(ctx)) // later calls: the first one's result
}

// Tasks Close gave up on before they ran are counted in its *CloseError and
// logged at Debug, not one Warn line each: a process shutting down with a
// backlog must not flood its log. A task that ran and failed is still a Warn.
func TestAbortedTasksAreNotLoggedAsFailures(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := New[int](WithWorkers(1), WithLogger(logger))
	require.NoError(t, err)
	ctx := watchdog(t)
	started := make(chan struct{})
	head, err := s.Submit(ctx, 0, func(ctx context.Context) error {
		close(started)
		<-ctx.Done() // cancelled when Close gives up
		return ctx.Err()
	})
	require.NoError(t, err)
	<-started
	const queued = 200
	cs := make([]*Completion, 0, queued)
	for k := 1; k <= queued; k++ {
		c, err := s.Submit(ctx, k, func(context.Context) error { return nil })
		require.NoError(t, err)
		cs = append(cs, c)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	cerr := s.Close(cctx)
	var ce *CloseError
	require.ErrorAs(t, cerr, &ce)
	require.Error(t, head.Wait(ctx))
	for _, c := range cs { // done only once its dead letter (here: the log line) was delivered
		require.ErrorIs(t, c.Wait(ctx), ErrAborted)
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	require.Equal(t, 1, strings.Count(out, "level=WARN msg=\"keysched: task failed\""), out)
	require.Contains(t, out, "key=0 ")
	require.Equal(t, queued, strings.Count(out, "level=DEBUG msg=\"keysched: task aborted by Close before it ran\""))
	require.GreaterOrEqual(t, s.Stats().Aborted, uint64(queued))
}

// After a Close that gave up, Drain waits for what Close left in the
// background: it returns nil only once every dead letter was delivered and
// every running task returned (a program that exits right after Close would
// lose the letters still being delivered).
func TestDrainAfterCloseWaitsForBackgroundLetters(t *testing.T) {
	release := make(chan struct{})
	var delivered atomic.Int64
	s, err := New[int](WithLogger(quiet), WithWorkers(2), WithDeadLetter(func(DeadLetter[int]) {
		<-release
		delivered.Add(1)
	}))
	require.NoError(t, err)
	const total = 200
	gate := make(chan struct{})
	for i := range total {
		_, err := s.Submit(t.Context(), i%10, func(context.Context) error { <-gate; return nil })
		require.NoError(t, err)
	}
	require.True(t, waitFor(watchdog(t), func() bool { return s.Stats().Running == 2 }))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var ce *CloseError
	require.ErrorAs(t, s.Close(ctx), &ce)
	require.Positive(t, ce.NotRun)

	// Drain with a context that has ended reports what is unfinished...
	require.Error(t, s.Drain(ctx))
	require.Zero(t, delivered.Load())
	// ...and with a live one waits for it.
	drained := make(chan error, 1)
	go func() { drained <- s.Drain(context.Background()) }()
	close(gate)
	close(release)
	require.NoError(t, <-drained)
	require.EqualValues(t, total-2, delivered.Load(), "every aborted task's letter (the two running tasks returned nil)")
	st := s.Stats()
	require.Zero(t, st.Pending)
	require.EqualValues(t, 2, st.Succeeded, "running tasks that returned nil")
	require.EqualValues(t, total-2, st.Aborted)
}
