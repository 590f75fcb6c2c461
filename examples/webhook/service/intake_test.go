package service

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
)

// Found by attacking the code (adversarial review of the service: first written as a failing reproducer).
//
// Invalid UTF-8 inside a JSON string passes encoding/json and was accepted
// (202), then forwarded byte for byte: a body no strict JSON parser takes,
// retried until its partner is parked (a poison event).
func TestIntakeRefusesInvalidUTF8(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {}}, nil)
	for _, body := range []string{
		"{\"type\":\"a\",\"data\":{\"s\":\"\xff\xfe\"}}",
		"{\"type\":\"a\",\"data\":{\"\xc3\":1}}",             // truncated sequence in a key
		"{\"type\":\"a\",\"data\":{\"s\":\"\xed\xa0\x80\"}}", // an encoded surrogate
	} {
		resp, err := http.Post(h.intake.URL+"/events/p", "application/json", bytes.NewBufferString(body))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(b))
		require.Contains(t, string(b), "UTF-8")
	}
	var n int
	require.NoError(t, h.store.db.QueryRow(`SELECT COUNT(*) FROM `+h.store.Outbox().Table()).Scan(&n))
	require.Zero(t, n, "nothing persisted")
	require.Zero(t, h.status("p").Backlog)
	// Valid multi-byte UTF-8 is accepted.
	resp, err := http.Post(h.intake.URL+"/events/p", "application/json", bytes.NewBufferString(`{"type":"a","data":{"s":"Grüße, 世界"}}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
}
