package bus_test

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/bus"
)

// TestInvalidKeyIsNotCountedAsPublished: a Publish refused with
// keysched.ErrInvalidKey ("with nothing published", PublishEnvelope's doc)
// is not counted in Stats.Published ("Publish calls that got past
// validation"), whatever the key's kind; a valid one after it is. Found by
// attacking the code: the count was taken before the first matching
// subscriber found the key unusable, so a NaN or a slice key, refused, read
// as published (and as keysched.bus.events.published in otelkeysched).
func TestInvalidKeyIsNotCountedAsPublished(t *testing.T) {
	b, err := bus.New[any](bus.WithWorkers(1))
	require.NoError(t, err)
	ctx := context.Background()
	defer func() { require.NoError(t, b.Close(ctx)) }()
	_, err = bus.Subscribe(b, "a", func(context.Context, bus.Envelope[any], int) error { return nil })
	require.NoError(t, err)
	for _, key := range []any{math.NaN(), []int{1}} {
		require.ErrorIs(t, b.Publish(ctx, key, 1), keysched.ErrInvalidKey)
	}
	require.Equal(t, bus.Stats{Subscribers: 1}, b.Stats())
	require.NoError(t, b.Publish(ctx, "k", 1))
	require.Equal(t, bus.Stats{Subscribers: 1, Published: 1}, b.Stats())
}
