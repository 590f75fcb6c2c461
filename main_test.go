package keysched

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: every
// scheduler a test makes is closed, and Close must leave nothing behind.
// (ants starts a default pool, with two goroutines, when it is imported:
// those exist before any test and are ignored.)
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreCurrent()) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newSched makes a scheduler that is closed (and checked to close cleanly)
// when the test ends. Its failures are logged nowhere unless the test says.
// After a failed test it is closed at once (Close's abort path): the failure
// may have left a key parked or a task blocked, and waiting for them would
// only delay the report.
func newSched[K comparable](t testing.TB, opts ...Option) *Scheduler[K] {
	t.Helper()
	s, err := New[K](append([]Option{WithLogger(quiet)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			_ = abortClose(s)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, s.Close(ctx))
	})
	return s
}

// watchdog bounds a wait that must end: a lost wake-up or a deadlock shows up
// as this context's deadline, not as a hung test binary. It is not a timing
// assertion: the bound is far above any normal run.
func watchdog(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// assertAccounting checks that every accepted task has exactly one outcome.
func assertAccounting(t require.TestingT, st Stats) {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
	require.Equal(t, st.Submitted, st.Succeeded+st.Failed+st.Panicked+st.Cancelled+st.Aborted, "%+v", st)
	require.Zero(t, st.Pending, "%+v", st)
}
