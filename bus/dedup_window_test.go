package bus_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/bus"
)

// Dedup refuses a window below 1 and a nil handler with an error wrapping
// keysched.ErrInvalidOption that names the bad argument (a window of 0
// panicked; a nil handler gave a nil handler, refused only later by
// Subscribe as "nil handler"); a window of 1 is accepted.
func TestDedupRefusesABadWindowOrHandlerWithAnError(t *testing.T) {
	h := func(context.Context, bus.Envelope[string], int) error { return nil }
	for _, window := range []int{0, -1} {
		d, err := bus.Dedup(h, window)
		require.ErrorIs(t, err, keysched.ErrInvalidOption, "window %d", window)
		require.ErrorContains(t, err, "window")
		require.Nil(t, d)
	}
	d, err := bus.Dedup[string, int](nil, 3)
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	require.ErrorContains(t, err, "nil handler")
	require.Nil(t, d)
	d, err = bus.Dedup(h, 1)
	require.NoError(t, err)
	require.NotNil(t, d)
}
