package service

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
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

// A destination that hangs holds only its bulkhead's share of the pool: with
// 4 workers, a budget of 2 per destination and a one-minute timeout, four
// partners on a hanging endpoint leave the healthy partners two workers, and
// those deliver everything while the hang lasts. (Without the bulkhead the
// four hanging calls would take all four workers for a minute.)
func TestHangingEndpointDoesNotStallOthers(t *testing.T) {
	rec := sim.NewRecorder()
	hang, err := sim.NewEndpoint(rec, sim.Behavior{Hang: true})
	require.NoError(t, err)
	defer hang.Close()
	h := newHarness(t, map[string]sim.Behavior{"g1": {}, "g2": {}, "g3": {Delay: 5 * time.Millisecond}}, func(c *Config) {
		c.Workers = 4
		c.Limits.Concurrency = 2
		c.Timeout = time.Minute
		c.Retry = keysched.RetryPolicy{MaxAttempts: 1000, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
		for _, p := range []string{"h1", "h2", "h3", "h4"} {
			c.Partners[p] = hang.URL
			sec, err := rec.NewSecret(p) // the hanging endpoint's recorder verifies them
			require.NoError(t, err)
			c.Secrets[p] = []string{sec}
		}
	})
	for i := range 10 {
		for _, p := range []string{"h1", "h2", "h3", "h4"} {
			c, _ := h.post(p, i)
			require.Equal(t, http.StatusAccepted, c)
		}
	}
	// The hanging destination is at its budget.
	require.Eventually(t, func() bool { _, n := rec.Total(); return n >= 2 }, waitLong, time.Millisecond)
	for i := range 30 {
		for _, p := range []string{"g1", "g2", "g3"} {
			c, _ := h.post(p, i)
			require.Equal(t, http.StatusAccepted, c)
		}
	}
	for _, p := range []string{"g1", "g2", "g3"} {
		require.Eventually(t, func() bool { return h.delivered(p) }, waitLong, 5*time.Millisecond, p)
		h.checkOrder(p)
	}
	// Nothing of the hanging partners arrived, and they still wait.
	accepted, _ := rec.Total()
	require.Zero(t, accepted)
	require.Equal(t, 10, h.status("h1").Backlog)
}

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
	require.NoError(t, h.svc.Skip(t.Context(), "p"))
	ids := h.acceptedIDs("p")
	require.Eventually(t, func() bool { return len(h.rec.IDs("p")) >= 3 }, waitLong, 5*time.Millisecond)
	_, err := sim.CheckOrder(ids[1:], h.rec.IDs("p"))
	require.NoError(t, err, "the head was skipped, the rest delivered in order")
	// (The endpoint records a delivery before it answers: the service
	// counts it a moment later.)
	require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond)
	require.Equal(t, uint64(1), h.status("p").Skipped)
	require.ErrorIs(t, h.svc.Skip(t.Context(), "p"), ErrNotParked)
}

// A restart on the same database delivers what the last process left.
func TestRestartDeliversBacklog(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {Down: true}}, nil)
	for i := range 10 {
		h.post("p", i)
	}
	cfg := h.svc.cfg
	h.stop()
	h.eps["p"].Set(sim.Behavior{})
	cfg.Store = nil
	h.start(cfg)
	// One snapshot: backlog and delivered are read under one lock (two
	// status calls raced with the relay and counted a delivery twice).
	st := h.status("p")
	require.Equal(t, 10, st.Backlog+int(st.Delivered))
	require.Eventually(t, func() bool { return h.delivered("p") }, waitLong, 5*time.Millisecond)
	h.checkOrder("p")
}
