package service

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/stretchr/testify/require"
)

// The history, lookup and replay on PostgreSQL (their SQL differs from
// SQLite's in types and placeholders): a parked event's replay retries it,
// a delivered one's sends it again after it, a pending replay outlives a
// restart, and the lookups show the attempts and states.
func TestPostgresHistoryAndReplay(t *testing.T) {
	open := postgresStore(t)
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusNoContent, "" })
	h := newHarnessOn(t, open, nil, func(c *Config) {
		c.Partners = map[string]string{"p": ep.srv.URL}
		c.Retry = keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	})
	ctx := context.Background()
	_, e0 := h.post("p", 0)
	require.Eventually(t, func() bool { return h.event(e0).State == StateDelivered }, waitLong, 5*time.Millisecond)
	ep.set(func(int, string) (int, string) { return http.StatusInternalServerError, "nope" })
	_, e1 := h.post("p", 1)
	require.Eventually(t, func() bool { return len(h.parked()) == 1 }, waitLong, 5*time.Millisecond)
	ev := h.event(e1)
	require.Equal(t, StateParked, ev.State)
	require.Len(t, ev.Attempts, 2)
	require.Equal(t, "nope", ev.Attempts[0].Body)
	require.Contains(t, ev.LastError, "500")

	res, err := h.svc.Replay(ctx, e0)
	require.NoError(t, err)
	require.Equal(t, []string{e0}, res.Requeued)
	cfg := h.svc.cfg
	h.stop()
	cfg.Store = nil
	ep.set(func(int, string) (int, string) { return http.StatusNoContent, "" })
	h.start(cfg)
	require.Equal(t, 2, h.status("p").Backlog, "the parked e1 and the replay of e0")
	res, err = h.svc.Replay(ctx, e1)
	require.NoError(t, err)
	require.Equal(t, []string{e1}, res.Recovered)
	require.Eventually(t, func() bool { ids, _ := ep.received(); return len(ids) == 3 }, waitLong, 5*time.Millisecond)
	ids, _ := ep.received()
	require.Equal(t, []string{e0, e1, e0}, ids)
	require.Eventually(t, func() bool { return h.event(e0).Replays[0].State == StateDelivered }, waitLong, 5*time.Millisecond)
	require.Eventually(t, func() bool { return h.event(e1).State == StateDelivered }, waitLong, 5*time.Millisecond)
	latest, err := h.svc.LatestEvents(ctx, "p", 10)
	require.NoError(t, err)
	require.Len(t, latest, 2)
	require.Equal(t, e1, latest[0].ID)
	require.Equal(t, StateDelivered, latest[0].State)
	require.Equal(t, 3, latest[0].Attempts)
	require.Equal(t, 1, latest[1].Replays)
	n, err := h.store.cleanupHistory(ctx, time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.EqualValues(t, 6, n, "5 attempts and the settled replay record")
}
