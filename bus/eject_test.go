package bus

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keysched/keysched"
	"github.com/stretchr/testify/require"
)

// lockedBuffer is a log sink safe for concurrent writers.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// letters collects dead letters.
type letters struct {
	mu  sync.Mutex
	all []DeadLetter[string]
}

func (l *letters) add(dl DeadLetter[string]) { l.mu.Lock(); l.all = append(l.all, dl); l.mu.Unlock() }

func (l *letters) byID() map[string]DeadLetter[string] {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[string]DeadLetter[string]{}
	for _, dl := range l.all {
		m[dl.Envelope.ID] = dl
	}
	return m
}

func (l *letters) len() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.all) }

// sleepy never returns before its context ends: every attempt times out.
func sleepy(ctx context.Context, _ Envelope[string], _ tick) error {
	<-ctx.Done()
	return ctx.Err()
}

func publishIDs(t *testing.T, b *Bus[string], key string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		require.NoError(t, b.PublishEnvelope(t.Context(), Envelope[string]{ID: id, Key: key, Event: tick{},
			Headers: map[string]string{"id": id}}))
	}
}

// Property 4: after n consecutive timed-out attempts the subscriber is
// ejected: its queued events are dead-lettered with ErrEjected, later
// publishes skip it, the bus logs it, and the others are unaffected.
func TestEjectAfterConsecutiveTimeouts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		logs := &lockedBuffer{}
		b, err := New[string](WithWorkers(4), WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
		require.NoError(t, err)
		var dls letters
		x, err := Subscribe(b, "x", sleepy, Timeout(time.Second), EjectAfter(3), MaxConcurrency(1),
			DeadLetters(dls.add))
		require.NoError(t, err)
		var mu sync.Mutex
		var yGot []string
		y, err := Subscribe(b, "y", func(_ context.Context, env Envelope[string], _ tick) error {
			mu.Lock()
			yGot = append(yGot, env.ID)
			mu.Unlock()
			return nil
		})
		require.NoError(t, err)

		publishIDs(t, b, "k", "e0", "e1", "e2", "e3", "e4", "e5")
		require.NoError(t, b.Drain(ctx))

		got := dls.byID()
		require.Len(t, got, 6)
		for _, id := range []string{"e0", "e1"} {
			require.ErrorIs(t, got[id].Err, context.DeadlineExceeded, id)
			require.NotErrorIs(t, got[id].Err, ErrEjected, id)
			require.Equal(t, 1, got[id].Attempts)
		}
		require.ErrorIs(t, got["e2"].Err, ErrEjected, "the attempt that ejected it")
		require.ErrorIs(t, got["e2"].Err, context.DeadlineExceeded)
		for _, id := range []string{"e3", "e4", "e5"} {
			dl := got[id]
			require.ErrorIs(t, dl.Err, ErrEjected, id)
			require.Equal(t, 0, dl.Attempts, "%s never ran", id)
			require.Equal(t, "x", dl.Subscriber)
			require.Equal(t, map[string]string{"id": id}, dl.Envelope.Headers, "the envelope is carried")
			require.Equal(t, tick{}, dl.Envelope.Event)
		}
		st := x.Stats()
		require.True(t, st.Ejected)
		require.EqualValues(t, 3, st.EjectedEvents)
		require.EqualValues(t, 6, st.DeadLettered)
		require.EqualValues(t, 6, st.Failed)
		require.EqualValues(t, 0, st.Succeeded)
		require.Contains(t, logs.String(), "subscriber ejected")
		require.Contains(t, logs.String(), "subscriber=x")

		// Later publishes skip it; the other subscriber carries on.
		publishIDs(t, b, "k", "e6")
		require.NoError(t, b.Drain(ctx))
		require.Equal(t, 6, dls.len(), "nothing new reaches an ejected subscriber")
		require.EqualValues(t, 1, x.Stats().Skipped)
		require.Equal(t, []string{"e0", "e1", "e2", "e3", "e4", "e5", "e6"}, yGot)
		require.False(t, y.Stats().Ejected)
		require.NoError(t, b.Close(ctx))
	})
}

// A success between timeouts resets the count; retries of timed-out
// attempts count.
func TestEjectCountsConsecutiveAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		b, err := New[string](WithWorkers(2), WithLogger(quiet))
		require.NoError(t, err)
		var dls letters
		x, err := Subscribe(b, "x", func(ctx context.Context, env Envelope[string], _ tick) error {
			if env.ID == "ok" {
				return nil
			}
			<-ctx.Done()
			return ctx.Err()
		}, Timeout(time.Second), EjectAfter(3), MaxConcurrency(1), DeadLetters(dls.add))
		require.NoError(t, err)
		publishIDs(t, b, "k", "t1", "t2", "ok", "t3", "t4", "ok")
		require.NoError(t, b.Drain(ctx))
		require.False(t, x.Stats().Ejected, "2 timeouts, a success, 2 timeouts: never 3 in a row")
		require.EqualValues(t, 2, x.Stats().Delivered)

		// With retries, the attempts of one event count: 3 attempts, ejected.
		var rdls letters
		r, err := Subscribe(b, "r", sleepy, Timeout(time.Second), EjectAfter(3), DeadLetters(rdls.add),
			Retry(keysched.RetryPolicy{MaxAttempts: 10, InitialBackoff: time.Millisecond}))
		require.NoError(t, err)
		publishIDs(t, b, "k", "r1", "r2")
		require.NoError(t, b.Drain(ctx))
		require.True(t, r.Stats().Ejected)
		require.False(t, x.Stats().Ejected, "x's two timeouts on r1 and r2 follow a success")
		got := rdls.byID()
		require.Equal(t, 3, got["r1"].Attempts)
		require.ErrorIs(t, got["r1"].Err, ErrEjected)
		require.ErrorIs(t, got["r1"].Err, context.DeadlineExceeded)
		require.ErrorIs(t, got["r2"].Err, ErrEjected)
		require.NoError(t, b.Close(ctx))
	})
}

// With Failure(Park) the ejected subscriber's parked keys are skipped, so the
// events behind them are dead-lettered too and Drain returns.
func TestEjectReleasesParkedKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		b, err := New[string](WithWorkers(2), WithLogger(quiet))
		require.NoError(t, err)
		var dls letters
		x, err := Subscribe(b, "x", sleepy, Timeout(time.Second), EjectAfter(3), MaxConcurrency(1),
			Failure(keysched.Park), DeadLetters(dls.add))
		require.NoError(t, err)
		publishIDs(t, b, "k1", "a0")
		publishIDs(t, b, "k2", "b0")
		publishIDs(t, b, "k3", "c0")
		publishIDs(t, b, "k1", "a1", "a2")
		publishIDs(t, b, "k3", "c1")
		publishIDs(t, b, "k4", "d0")
		require.NoError(t, b.Drain(ctx))

		got := dls.byID()
		ids := make([]string, 0, len(got))
		for id := range got {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		require.Equal(t, []string{"a0", "a1", "a2", "b0", "c0", "c1", "d0"}, ids)
		require.ErrorIs(t, got["a0"].Err, context.DeadlineExceeded)
		require.ErrorIs(t, got["b0"].Err, context.DeadlineExceeded)
		require.ErrorIs(t, got["c0"].Err, ErrEjected)
		for _, id := range []string{"a1", "a2", "c1", "d0"} {
			require.ErrorIs(t, got[id].Err, ErrEjected, id)
			require.Equal(t, 0, got[id].Attempts, id)
		}
		st := x.Stats()
		require.True(t, st.Ejected)
		require.Zero(t, st.ParkedKeys)
		require.Empty(t, x.Parked())
		require.NoError(t, b.Close(ctx))
	})
}

// A subscriber whose handler ignores its context is still ejected: an
// attempt that returns after its deadline counts as timed out.
func TestEjectHandlerIgnoringContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		b, err := New[string](WithWorkers(2), WithLogger(quiet))
		require.NoError(t, err)
		var dls letters
		x, err := Subscribe(b, "x", func(context.Context, Envelope[string], tick) error {
			time.Sleep(2 * time.Second) // overruns its 1s deadline, then reports success
			return nil
		}, Timeout(time.Second), EjectAfter(2), MaxConcurrency(1), DeadLetters(dls.add))
		require.NoError(t, err)
		publishIDs(t, b, "k", "s0", "s1", "s2")
		require.NoError(t, b.Drain(ctx))
		st := x.Stats()
		require.True(t, st.Ejected)
		require.EqualValues(t, 2, st.Delivered, "late successes are delivered")
		got := dls.byID()
		require.Len(t, got, 1)
		require.True(t, errors.Is(got["s2"].Err, ErrEjected))
		require.NoError(t, b.Close(ctx))
	})
}
