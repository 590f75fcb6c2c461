package service

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// Replay of an event whose partner is no longer configured is
// ErrUnknownPartner (a 404), and nothing is written: it was requeued, and its
// new delivery failed ("unknown partner") for every attempt, then parked a
// partner the operator page does not list and its actions refuse.
func TestReplayOfAnEventOfARemovedPartnerIsRefused(t *testing.T) {
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusNoContent, "" })
	h := newHarness(t, nil, func(c *Config) { c.Partners = map[string]string{"p": ep.srv.URL, "q": ep.srv.URL} })
	eq := h.postDelivered("q", 1)[0]
	cfg := h.svc.cfg
	h.stop()
	cfg.Store = nil
	delete(cfg.Partners, "q")
	delete(cfg.Secrets, "q")
	h.start(cfg)
	res, err := h.svc.Replay(context.Background(), eq)
	require.ErrorIs(t, err, ErrUnknownPartner)
	require.Empty(t, res.Requeued)
	code, _ := adminForm(t, h.admin.URL+"/events/"+eq+"/replay", nil, nil)
	require.Equal(t, http.StatusNotFound, code)
	n, err := h.store.ob.Count(context.Background())
	require.NoError(t, err)
	require.Zero(t, n[0], "no delivery written")
	require.Empty(t, h.event(eq).Replays)
}
