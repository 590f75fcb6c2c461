package service

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
)

// A 429 with Retry-After is no attempt spent (result="deferred" in the
// metrics): the event's lookup lists it as outcome "deferred" (it said
// "failed"); a 503 without Retry-After stays "failed".
func TestDeferredAnswerIsListedAsDeferred(t *testing.T) {
	ep := newAnswering(t, answer(http.StatusTooManyRequests, "Retry-After", "0"), answer(http.StatusServiceUnavailable), answer(http.StatusNoContent))
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) { c.Partners["p"] = ep.srv.URL })
	id := h.postDelivered("p", 1)[0]

	resp, err := http.Get(h.admin.URL + "/events/" + id)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var ev struct {
		Attempts []struct {
			Outcome string `json:"outcome"`
			Status  int    `json:"status"`
		} `json:"attempts"`
	}
	require.NoError(t, json.Unmarshal(b, &ev), "%s", b)
	require.Len(t, ev.Attempts, 3, "%s", b)
	require.Equal(t, "deferred", ev.Attempts[0].Outcome, "%s", b)
	require.Equal(t, http.StatusTooManyRequests, ev.Attempts[0].Status)
	require.Equal(t, "failed", ev.Attempts[1].Outcome, "%s", b)
	require.Equal(t, "delivered", ev.Attempts[2].Outcome, "%s", b)
}
