// Parking a partner: after its attempts run out its events wait, none
// dropped; Resume delivers them in order, Skip gives up the head only.

package service

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/sim"
)

// After its attempts run out the partner is parked: its later events are
// accepted and wait, none is dropped; Resume delivers them all in order.
func TestParkedPartnerResumesInOrder(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {Down: true}, "other": {}}, func(c *Config) {
		c.Retry = keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
	})
	for i := range 5 {
		c, _ := h.post("p", i)
		require.Equal(t, http.StatusAccepted, c)
	}
	require.Eventually(t, func() bool { return len(h.parked()) == 1 }, waitLong, 5*time.Millisecond)
	require.Equal(t, []string{"p"}, h.parked())
	for i := 5; i < 10; i++ {
		c, _ := h.post("p", i)
		require.Equal(t, http.StatusAccepted, c)
		c, _ = h.post("other", i)
		require.Equal(t, http.StatusAccepted, c)
	}
	require.Eventually(t, func() bool { return h.delivered("other") }, waitLong, 5*time.Millisecond)
	st := h.status("p")
	require.True(t, st.Parked)
	require.Equal(t, 10, st.Backlog)
	require.Equal(t, uint64(1), st.Parks)
	require.Empty(t, h.rec.IDs("p"))
	require.ErrorIs(t, h.svc.Resume(t.Context(), "other"), ErrNotParked)

	h.eps["p"].Set(sim.Behavior{})
	require.NoError(t, h.svc.Resume(t.Context(), "p"))
	require.Eventually(t, func() bool { return h.delivered("p") }, waitLong, 5*time.Millisecond)
	h.checkOrder("p")
	require.Empty(t, h.parked())
}

func TestSkipGivesUpTheHeadOnly(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {Down: true}}, func(c *Config) {
		c.Retry = keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
	})
	for i := range 4 {
		h.post("p", i)
	}
	require.Eventually(t, func() bool { return len(h.parked()) == 1 }, waitLong, 5*time.Millisecond)
	h.eps["p"].Set(sim.Behavior{})
	ids := h.acceptedIDs("p")
	require.Equal(t, ids[0], h.head("p"))
	require.NoError(t, h.svc.Skip(t.Context(), "p", ids[0]))
	require.Eventually(t, func() bool { return len(h.rec.IDs("p")) >= 3 }, waitLong, 5*time.Millisecond)
	_, err := sim.CheckOrder(ids[1:], h.rec.IDs("p"))
	require.NoError(t, err, "the head was skipped, the rest delivered in order")
	// (The endpoint records a delivery before it answers: the service
	// counts it a moment later.)
	require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond)
	require.Equal(t, uint64(1), h.status("p").Skipped)
	require.ErrorIs(t, h.svc.Skip(t.Context(), "p", ids[0]), ErrNotParked)
}
