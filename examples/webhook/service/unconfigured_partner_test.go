package service

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/examples/webhook/sim"
)

// A partner removed from the configuration while one of its events is
// undelivered: New refuses to start, naming the partner and its count (the
// event was attempted, failed with "unknown partner", and parked the partner
// where no operator action reached it); with SkipUnconfigured the event is
// marked skipped and the others are delivered.
func TestUnconfiguredPartnerWithUndeliveredEventsIsRefusedAtStart(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"gone": {Down: true}, "kept": {}}, nil)
	_, id := h.post("gone", 0)
	cfg := h.svc.cfg
	h.stop()
	delete(cfg.Partners, "gone")
	delete(cfg.Secrets, "gone")

	st, err := h.open()
	require.NoError(t, err)
	cfg.Store = st
	svc, err := New(t.Context(), cfg)
	if err == nil {
		_ = svc.Close(t.Context())
	}
	require.NoError(t, st.Close())
	require.ErrorIs(t, err, ErrUnconfiguredPartner)
	require.ErrorContains(t, err, `"gone" (1 undelivered)`)

	cfg.SkipUnconfigured = true
	cfg.Store = nil
	h.start(cfg)
	ev, err := h.store.Outbox().Lookup(t.Context(), id)
	require.NoError(t, err)
	require.Equal(t, outbox.Skipped, ev.State)
	h.postDelivered("kept", 1)
	require.Never(t, func() bool { p, _ := h.svc.Parked(t.Context()); return len(p) > 0 }, 100*time.Millisecond, 10*time.Millisecond)
}
