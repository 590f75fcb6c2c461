package service

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
)

// The messages an operator or a producer reads say what is wanted or what
// to do. Before: a replay range with from >= to said only "bad time range:
// [...)"; an intake body "[]" answered "cannot unmarshal array into Go value
// of type service.IntakeRequest"; the park log line said "wait for an
// operator" without naming Resume or Skip, and a 401's park reason did not
// point at the signing secret.
func TestOperatorMessagesSayWhatToDo(t *testing.T) {
	ep := newAnswering(t, func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, "bad signature")
	})
	logs := &syncBuffer{}
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) {
		c.Partners["p"] = ep.srv.URL
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})

	code, body := adminForm(t, h.admin.URL+"/partners/p/replay",
		url.Values{"from": {"2026-01-02T00:00:00Z"}, "to": {"2026-01-01T00:00:00Z"}}, nil)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "from must be before to")

	for in, want := range map[string]string{
		`[]`:                           `need one JSON object {\"type\":\"...\",\"data\":{...}}: got a JSON array`,
		`{"type":5,"data":{}}`:         `field \"type\": got a JSON number`,
		``:                             `the body is empty`,
		`{"type":"a.b","data":{}, "x"`: `the JSON ends early`,
	} {
		resp, err := http.Post(h.intake.URL+"/events/p", "application/json", bytes.NewBufferString(in))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, in)
		require.Contains(t, string(b), want, in)
		require.NotContains(t, string(b), "Go value", in)
	}

	_, id := h.post("p", 0)
	require.Eventually(t, func() bool { return h.head("p") == id }, waitLong, 5*time.Millisecond)
	require.Contains(t, h.status("p").LastError, "check that the partner's signing secret, -secrets-file, is the receiver's, then Resume")
	require.Contains(t, h.event(id).LastError, "signing secret")
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "Resume (retries this event) or Skip (gives it up)")
	}, waitLong, 5*time.Millisecond, "the park log line")
}
