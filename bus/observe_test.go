package bus

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
)

// Observe reaches the subscriber's scheduler: its observer sees each event's
// attempt with the handler's duration; TaskAges gives OldestAge and Keys.
func TestObserveAndAges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b, err := New[string](WithWorkers(8), WithLogger(quiet))
		require.NoError(t, err)
		defer b.Close(ctx)
		var mu sync.Mutex
		var durations []time.Duration
		release := make(chan struct{})
		sub, err := Subscribe(b, "slow", func(context.Context, Envelope[string], string) error {
			time.Sleep(2 * time.Second)
			return nil
		}, Observe(keysched.Observer[string]{AttemptEnded: func(_ string, a keysched.AttemptInfo) {
			mu.Lock()
			durations = append(durations, a.Ended.Sub(a.Started))
			mu.Unlock()
		}}))
		require.NoError(t, err)
		plain, err := Subscribe(b, "plain", func(context.Context, Envelope[string], string) error { <-release; return nil })
		require.NoError(t, err)
		aged, err := Subscribe(b, "aged", func(context.Context, Envelope[string], string) error { <-release; return nil }, TaskAges())
		require.NoError(t, err)

		require.NoError(t, b.Publish(ctx, "k1", "a"))
		require.NoError(t, b.Publish(ctx, "k1", "b"))
		time.Sleep(time.Minute)
		require.NoError(t, b.Publish(ctx, "k2", "c"))
		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, time.Second, sub.OldestAge(), "Observe implies ages: its event for k2 runs since 1 s")
		require.Equal(t, time.Minute+time.Second, aged.OldestAge())
		require.Zero(t, plain.OldestAge(), "no ages without TaskAges or Observe")
		require.Equal(t, []keysched.KeyInfo[string]{
			{Key: "k1", Depth: 2, HeadAge: time.Minute + time.Second},
			{Key: "k2", Depth: 1, HeadAge: time.Second},
		}, aged.Keys(0))
		require.Equal(t, []keysched.KeyInfo[string]{{Key: "k1", Depth: 2}}, plain.Keys(1))

		close(release)
		require.NoError(t, b.Drain(ctx))
		mu.Lock()
		require.Equal(t, []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}, durations)
		mu.Unlock()
		require.Zero(t, sub.OldestAge())
	})
}

func TestObserveWrongKeyType(t *testing.T) {
	b, err := New[string](WithLogger(quiet))
	require.NoError(t, err)
	defer b.Close(context.Background())
	_, err = Subscribe(b, "x", func(context.Context, Envelope[string], string) error { return nil },
		Observe(keysched.Observer[int]{AttemptEnded: func(int, keysched.AttemptInfo) {}}))
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
}
