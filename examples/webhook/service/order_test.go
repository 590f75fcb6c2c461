// Delivery order: every event arrives, in order per partner, through
// endpoints that are slow, flaky, hang or are down for a while.

package service

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/examples/webhook/sim"
)

// Endpoints that are slow, fail 30% of the time, hang and come back, are
// down and come back: every event arrives, in order per partner, each
// delivery carrying its event ID (the endpoints reject a request without).
func TestDeliveryInOrderThroughFlakyEndpoints(t *testing.T) {
	behaviors := map[string]sim.Behavior{
		"slow":    {Delay: 20 * time.Millisecond},
		"flaky":   {FailRate: 0.3},
		"hangs":   {Hang: true},
		"down":    {Down: true},
		"healthy": {},
	}
	h := newHarness(t, behaviors, nil)
	const n = 40
	for i := range n {
		for p := range behaviors {
			c, _ := h.post(p, i)
			require.Equal(t, http.StatusAccepted, c)
		}
		if i == n/2 {
			// Half-way: the hanging and the down endpoints come back.
			h.eps["hangs"].Set(sim.Behavior{})
			h.eps["down"].Set(sim.Behavior{})
		}
	}
	for p := range behaviors {
		require.Eventually(t, func() bool { return h.delivered(p) }, waitLong, 5*time.Millisecond, p)
	}
	for p := range behaviors {
		dups := h.checkOrder(p)
		t.Logf("%s: %d events, %d duplicates", p, n, dups)
	}
	require.Eventually(t, func() bool {
		for _, s := range h.statuses() {
			if s.Backlog != 0 {
				return false
			}
		}
		return true
	}, waitLong, 5*time.Millisecond)
	st := h.status("flaky")
	require.GreaterOrEqual(t, st.Delivered, uint64(n), "each event delivered (a redelivery counts again)")
	require.NotZero(t, st.Failed, "a 30%% failure rate over %d events failed no attempt", n)
}
