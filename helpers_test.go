// Helpers shared by the package's tests.

package keysched

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
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

// recvWithin returns what ch delivers, or fails the test by name once d has
// passed (a bound far above any normal run, not a timing assertion); what
// names the awaited value in the failure.
func recvWithin[T any](t testing.TB, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing within %v", what, d)
	}
	var zero T
	return zero
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

// errCloseOverran is what abortClose returns when Close has not returned
// 10 s after it gave up (it promises CloseGrace).
var errCloseOverran = errors.New("abortClose: Close with an ended context did not return within 10 s")

// abortClose closes s with an already ended context (Close's abort path).
// Close returns within CloseGrace; past a bound of 10 s (far above that, not
// a timing assertion) abortClose returns errCloseOverran instead of waiting,
// so the calling test fails by name rather than hanging the binary.
func abortClose(s interface{ Close(context.Context) error }) error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	closed := make(chan error, 1)
	go func() { closed <- s.Close(ctx) }()
	select {
	case err := <-closed:
		return err
	case <-time.After(10 * time.Second):
		return errCloseOverran
	}
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

// submitCancellableHead submits to key a task that runs until its context
// is cancelled (Close's abort cancels it) and returns its error; the
// returned channel is closed once it runs.
func submitCancellableHead(t *testing.T, s *Scheduler[string], key string) <-chan struct{} {
	t.Helper()
	started := make(chan struct{})
	if _, err := s.Submit(context.Background(), key, func(ctx context.Context) error {
		close(started)
		<-ctx.Done() // respects its context: Close's abort cancels it
		return ctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	return started
}

// doneOrParked is a condition for waitFor: c is done, or a key of s is
// parked.
func doneOrParked[K comparable](s *Scheduler[K], c *Completion) func() bool {
	return func() bool {
		return isDone(c) || len(s.Parked()) > 0
	}
}

// isDone reports whether c is done, without waiting.
func isDone(c *Completion) bool {
	select {
	case <-c.Done():
		return true
	default:
		return false
	}
}

// otherKeyRunsMeanwhile submits n tasks to key (inside a synctest bubble)
// and checks that all of them are done, without error, once the bubble is
// idle: no time passes, so nothing another key waits for holds them.
func otherKeyRunsMeanwhile(t *testing.T, s *Scheduler[string], key string, n int, msg string) {
	t.Helper()
	var others []*Completion
	for range n {
		c, err := s.Submit(context.Background(), key, func(context.Context) error { return nil })
		require.NoError(t, err)
		others = append(others, c)
	}
	synctest.Wait()
	for _, c := range others {
		require.True(t, isDone(c), msg)
		require.NoError(t, c.Err())
	}
}

// resolveParked resumes or skips (at random) every parked key of s, every
// pace, until stop is closed.
func resolveParked[K comparable](s *Scheduler[K], rng *rand.Rand, stop <-chan struct{}, pace time.Duration) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		for _, k := range s.Parked() {
			if rng.IntN(2) == 0 {
				_ = s.Resume(k)
			} else {
				_ = s.Skip(k)
			}
		}
		time.Sleep(pace) // polling pace
	}
}

// closeAbortsWaitingKey submits to key a task that then waits to run again
// (it fails into a backoff, or snoozes) and one behind it; once the bubble
// is idle it closes s with an ended context and checks that Close and both
// tasks end with ErrAborted. It returns Close's error.
func closeAbortsWaitingKey(t *testing.T, s *Scheduler[int], key int, task Task) error {
	t.Helper()
	ctx := context.Background()
	waiting, err := s.Submit(ctx, key, task)
	require.NoError(t, err)
	behind, err := s.Submit(ctx, key, func(context.Context) error { return nil })
	require.NoError(t, err)
	synctest.Wait()
	err = abortClose(s)
	require.ErrorIs(t, err, ErrAborted)
	require.ErrorIs(t, waiting.Wait(ctx), ErrAborted)
	require.ErrorIs(t, behind.Wait(ctx), ErrAborted)
	synctest.Wait()
	return err
}

// submitFailing submits to key a task whose every attempt fails.
func submitFailing(t *testing.T, s *Scheduler[string], key string) *Completion {
	t.Helper()
	c, err := s.Submit(context.Background(), key, func(context.Context) error { return errors.New("fails") })
	if err != nil {
		t.Fatal(err)
	}
	return c
}
