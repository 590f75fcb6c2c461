package bus_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/bus"
	"github.com/keysched/keysched/internal/zerotest"
)

// TestZeroValues calls every exported method of a nil and a zero Bus and
// Subscription (not made by New or Subscribe): each error result is
// ErrZeroBus or ErrZeroSubscription, each other result the zero value, and
// nothing panics or hangs. A method added to a type and not to its list here
// fails the test. Subscribe on a nil or zero Bus is ErrZeroBus too.
func TestZeroValues(t *testing.T) {
	t.Run("Bus", func(t *testing.T) {
		zerotest.Check[bus.Bus[string]](t, bus.ErrZeroBus, []string{
			"Close", "Drain", "Publish", "PublishEnvelope", "PublishEnvelopeStrict", "Stats", "Subscriptions",
		})
	})
	t.Run("Subscription", func(t *testing.T) {
		zerotest.Check[bus.Subscription[string]](t, bus.ErrZeroSubscription, []string{
			"Drain", "Keys", "Name", "OldestAge", "Parked", "Resume", "Skip", "Stats", "Unsubscribe",
		})
	})
	t.Run("Subscribe", func(t *testing.T) {
		h := func(context.Context, bus.Envelope[string], int) error { return nil }
		for _, b := range []*bus.Bus[string]{nil, new(bus.Bus[string])} {
			s, err := bus.Subscribe(b, "x", h)
			require.ErrorIs(t, err, bus.ErrZeroBus)
			require.Equal(t, 1, strings.Count(err.Error(), "bus:"), "one package prefix: %v", err)
			require.Nil(t, s)
		}
	})
}
