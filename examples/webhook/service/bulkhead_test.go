// Bulkheads: a hanging destination holds at most its concurrency budget of
// the workers; other destinations are served meanwhile.

package service

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/sim"
)

// A hanging destination holds at most its concurrency budget; the attempt
// beyond it fails at once, and another destination is served meanwhile.
func TestBulkheadIsolatesHangingDestination(t *testing.T) {
	rec := sim.NewRecorder()
	hang := newEndpoint(t, rec, sim.Behavior{Hang: true})
	ok := newEndpoint(t, rec, sim.Behavior{})
	d := testDeliverer(t, rec, map[string]string{"h1": hang.URL, "h2": hang.URL, "h3": hang.URL, "ok": ok.URL},
		func(c *DelivererConfig) { c.Limits.Concurrency = 2; c.Timeout = time.Minute })
	require.Equal(t, d.Destination("h1"), d.Destination("h3"))
	require.NotEqual(t, d.Destination("h1"), d.Destination("ok"))

	ctx, cancel := context.WithCancel(t.Context())
	errs := make(chan error, 2)
	for _, p := range []string{"h1", "h2"} {
		go func() { errs <- d.Deliver(ctx, Delivery{Partner: p, ID: p}) }()
	}
	// Both hang inside the endpoint.
	require.Eventually(t, func() bool { _, n := rec.Total(); return n == 2 }, 10*time.Second, time.Millisecond)
	require.ErrorIs(t, d.Deliver(t.Context(), Delivery{Partner: "h3", ID: "h3"}), ErrBulkheadFull)
	for i := range 20 {
		require.NoError(t, d.Deliver(t.Context(), Delivery{Partner: "ok", ID: string(rune('a' + i))}))
	}
	cancel()
	for range 2 {
		require.ErrorIs(t, <-errs, context.Canceled)
	}
	// The budget came back.
	hang.Set(sim.Behavior{})
	require.NoError(t, d.Deliver(t.Context(), Delivery{Partner: "h3", ID: "h3"}))
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
