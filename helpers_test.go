// Helpers shared by the package's tests.

package keysched

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// hangGuard is a hang guard: a deadline far above any normal run.
func hangGuard(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds or ctx ends (a deadline, not a timing
// assertion). It reports whether cond held.
func waitFor(ctx context.Context, cond func() bool) bool {
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Millisecond):
		}
	}
	return true
}

// abortClose closes s with an already ended context (Close's abort path).
func abortClose(s interface{ Close(context.Context) error }) error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return s.Close(ctx)
}

// hookErr is an error whose As method (called by errors.As, so by
// IsPermanent inside the runner's failed()) lets the test act while the runner
// is between failed()'s "cancelled?/aborting?" checks and its transition to
// stWaiting. It only widens a window that any preemption opens as well.
type hookErr struct {
	once    sync.Once
	in      chan struct{}
	release chan struct{}
}

func newHookErr() *hookErr {
	return &hookErr{in: make(chan struct{}), release: make(chan struct{})}
}

func (e *hookErr) Error() string { return "hook error" }

func (e *hookErr) As(any) bool {
	e.once.Do(func() {
		close(e.in)
		<-e.release
	})
	return false
}

// requireCloseSettles asserts that Close's error, if any, is a *CloseError,
// and that every Completion in all becomes done (a watchdog turns one that
// never does into a failure naming its state).
func requireCloseSettles[K comparable](t *testing.T, s *Scheduler[K], err error, all []*Completion) {
	t.Helper()
	if err != nil {
		var ce *CloseError
		require.ErrorAs(t, err, &ce)
	}
	wd := watchdog(t)
	for i, c := range all {
		select {
		case <-c.Done():
		case <-wd.Done():
			t.Fatalf("completion %d of %d never done (state %d, stats %+v)", i, len(all), c.state.Load(), s.Stats())
		}
	}
}
