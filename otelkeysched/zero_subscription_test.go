package otelkeysched_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/bus"
	"github.com/keysched/keysched/otelkeysched"
)

// TestZeroSubscriptionRefused: RegisterSubscription refuses a zero
// bus.Subscription (one not returned by bus.Subscribe), as it refuses a
// typed nil one, and registers nothing. Found by attacking the code: it was
// accepted, and every collection reported its series, all 0, under
// subscription="" until Unregister.
func TestZeroSubscriptionRefused(t *testing.T) {
	reader, mp := manualMeterProvider(t)
	r, err := otelkeysched.RegisterSubscription(mp, &bus.Subscription[string]{})
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	require.Nil(t, r)
	vals, _ := collect(t, reader)
	require.Empty(t, vals, "nothing registered")
}
