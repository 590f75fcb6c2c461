package service

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

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

// A 429 without Retry-After spends an attempt: listed "failed" even when
// its body (the partner's text, quoted in the error after the status)
// holds what a deferring answer's error says after its status (a proxy
// passing on another webhook service's error). The outcome was read from
// anywhere in the stored error text: it said "deferred".
func TestFailedAnswerWhoseBodyQuotesARetryAfterIsListedAsFailed(t *testing.T) {
	deferring := (&ResponseError{Response{Outcome: SnoozeUntil, Status: http.StatusTooManyRequests, RetryAfter: time.Second}}).Error()
	require.True(t, deferredError(http.StatusTooManyRequests, "attempt: "+deferring))
	failed := (&ResponseError{Response{Outcome: Retry, Status: http.StatusTooManyRequests, Body: []byte("upstream: " + deferring)}}).Error()
	require.False(t, deferredError(http.StatusTooManyRequests, failed), failed)
}
