package keysched

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// A task that calls Close with a context other than its own deadlocks (Close
// waits for the task, the task for Close), and nothing can tell it from a
// Close waiting for a long task: the scheduler knows a task only by its
// context. So a Close still waiting after CloseWaitWarning logs one warning
// that names the running and parked counts and that hang; a Close that
// finishes sooner logs nothing.
func TestCloseStillWaitingLogsAWarningOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var buf bytes.Buffer
		logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))
		logged := func() string { mu.Lock(); defer mu.Unlock(); return buf.String() }

		s, err := New[string](WithLogger(logger))
		require.NoError(t, err)
		ctx := context.Background()
		release := make(chan struct{})
		_, err = s.Submit(ctx, "k", func(context.Context) error { <-release; return nil })
		require.NoError(t, err)
		closed := make(chan error, 1)
		go func() { closed <- s.Close(ctx) }()

		time.Sleep(CloseWaitWarning - time.Millisecond)
		synctest.Wait()
		require.Empty(t, logged(), "no warning before CloseWaitWarning")
		time.Sleep(10 * CloseWaitWarning) // one warning, not one per period
		synctest.Wait()
		out := logged()
		require.Equal(t, 1, strings.Count(out, "Close still waiting"), out)
		require.Contains(t, out, "running=1")
		require.Contains(t, out, "parked_keys=0")
		require.Contains(t, out, "a task that calls Close")
		close(release)
		require.NoError(t, <-closed)

		// A Close that is done within CloseWaitWarning says nothing.
		mu.Lock()
		buf.Reset()
		mu.Unlock()
		s2, err := New[string](WithLogger(logger))
		require.NoError(t, err)
		_, err = s2.Submit(ctx, "k", func(context.Context) error { time.Sleep(CloseWaitWarning / 2); return nil })
		require.NoError(t, err)
		require.NoError(t, s2.Close(ctx))
		time.Sleep(2 * CloseWaitWarning)
		synctest.Wait()
		require.Empty(t, logged())
	})
}

// The warning gives the hint that fits what Close waits for: a parked key
// waits for an operator, not for a task that called Close (the hang hint
// led the warning even when only a parked key held Close).
func TestCloseWaitWarningFitsWhatCloseWaitsFor(t *testing.T) {
	parked := closeWaitsMessage(0, 1)
	require.Contains(t, parked, "Resume or Skip")
	require.NotContains(t, parked, "a task that calls Close")
	running := closeWaitsMessage(1, 0)
	require.Contains(t, running, "a task that calls Close")
	require.NotContains(t, running, "Resume or Skip")
	both := closeWaitsMessage(2, 3)
	require.Contains(t, both, "Resume or Skip")
	require.Contains(t, both, "a task that calls Close")
}
