package service

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/sim"
)

// An event's last_error is there while its latest delivery is parked or
// skipped, and gone once that delivery moves on: after Resume (delivered),
// and after Skip then Replay (delivered). It stayed, next to "state:
// delivered".
func TestLastErrorOnlyWhileParkedOrSkipped(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {Down: true}}, func(c *Config) {
		c.Retry = keysched.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	})
	event := func(id string) EventInfo {
		ev, err := h.svc.Event(t.Context(), id)
		require.NoError(t, err)
		return ev
	}
	parked := func() bool { return len(h.parked()) == 1 }
	delivered := func(id string) func() bool {
		return func() bool { return event(id).State == StateDelivered }
	}

	// Parked, then resumed and delivered.
	_, a := h.post("p", 0)
	require.Eventually(t, parked, waitLong, 5*time.Millisecond)
	ev := event(a)
	require.Equal(t, StateParked, ev.State)
	require.NotEmpty(t, ev.LastError)
	h.eps["p"].Set(sim.Behavior{})
	require.NoError(t, h.svc.Resume(t.Context(), "p"))
	require.Eventually(t, delivered(a), waitLong, 5*time.Millisecond)
	require.Empty(t, event(a).LastError, "delivered after Resume")

	// Parked, skipped, replayed and delivered.
	h.eps["p"].Set(sim.Behavior{Down: true})
	_, b := h.post("p", 1)
	require.Eventually(t, parked, waitLong, 5*time.Millisecond)
	require.NoError(t, h.svc.Skip(t.Context(), "p", b))
	ev = event(b)
	require.Equal(t, StateSkipped, ev.State)
	require.NotEmpty(t, ev.LastError)
	h.eps["p"].Set(sim.Behavior{})
	_, err := h.svc.Replay(t.Context(), b)
	require.NoError(t, err)
	require.Eventually(t, delivered(b), waitLong, 5*time.Millisecond)
	require.Empty(t, event(b).LastError, "delivered by a replay after Skip")
}
