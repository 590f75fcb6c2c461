package service

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/examples/webhook/sim"
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

func TestIntakeValidatesShape(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"acme": {Hang: true}}, nil)
	cases := []struct {
		name, partner, ctype, body string
		want                       int
	}{
		{"unknown partner", "nobody", "application/json", `{"type":"a","data":{}}`, 404},
		{"bad partner name", "bad%20name", "application/json", `{"type":"a","data":{}}`, 404},
		{"not json", "acme", "application/json", `hello`, 400},
		{"unknown field", "acme", "application/json", `{"type":"a","data":{},"x":1}`, 400},
		{"no type", "acme", "application/json", `{"data":{}}`, 400},
		{"bad type", "acme", "application/json", `{"type":"a b","data":{}}`, 400},
		{"data not an object", "acme", "application/json", `{"type":"a","data":[1]}`, 400},
		{"no data", "acme", "application/json", `{"type":"a"}`, 400},
		{"two objects", "acme", "application/json", `{"type":"a","data":{}}{}`, 400},
		{"wrong content type", "acme", "text/plain", `{"type":"a","data":{}}`, 415},
		{"too big", "acme", "application/json", `{"type":"a","data":{"x":"` + strings.Repeat("x", MaxBodyBytes) + `"}}`, 413},
		{"good", "acme", "application/json; charset=utf-8", `{"type":"order.created","data":{"n":1}}`, 202},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := http.Post(h.intake.URL+"/events/"+c.partner, c.ctype, bytes.NewBufferString(c.body))
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, c.want, resp.StatusCode, string(b))
			require.Contains(t, string(b), map[bool]string{true: `"id"`, false: `"error"`}[c.want == 202])
		})
	}
	resp, err := http.Get(h.intake.URL + "/events/acme")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	// Exactly one event was persisted: one outbox row and one intake record.
	var n int
	require.NoError(t, h.store.db.QueryRow(`SELECT COUNT(*) FROM `+h.store.intake).Scan(&n))
	require.Equal(t, 1, n)
	require.NoError(t, h.store.db.QueryRow(`SELECT COUNT(*) FROM `+h.store.Outbox().Table()).Scan(&n))
	require.Equal(t, 1, n)
	require.Equal(t, 1, h.status("acme").Backlog)
}

func TestFloodedPartnerGets429OthersDoNot(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"flood": {Hang: true}, "calm": {}}, func(c *Config) {
		c.MaxBacklog = 20
		c.RetryAfter = 3 * time.Second
	})
	var wg sync.WaitGroup
	codes := make(chan int, 100)
	for i := range 100 {
		wg.Go(func() { c, _ := h.post("flood", i); codes <- c })
	}
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	require.Equal(t, map[int]int{202: 20, 429: 80}, count, "exactly the bound is admitted")
	// Each admitted event is persisted once (outbox row and intake record,
	// committed together by the group commit), and nothing else is.
	var rows, records int
	require.NoError(t, h.store.db.QueryRow(`SELECT COUNT(*) FROM `+h.store.Outbox().Table()+` WHERE key = 'flood'`).Scan(&rows))
	require.NoError(t, h.store.db.QueryRow(`SELECT COUNT(*) FROM `+h.store.intake+` WHERE partner = 'flood'`).Scan(&records))
	require.Equal(t, 20, rows)
	require.Equal(t, 20, records)
	// The 429 says when to come back.
	resp, err := http.Post(h.intake.URL+"/events/flood", "application/json", bytes.NewBufferString(`{"type":"a","data":{}}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, "3", resp.Header.Get("Retry-After"))
	// The other partner is not affected (it stays under its own bound),
	// and is delivered.
	for i := range 15 {
		c, _ := h.post("calm", i)
		require.Equal(t, http.StatusAccepted, c)
	}
	require.Eventually(t, func() bool { return h.delivered("calm") }, waitLong, 5*time.Millisecond)
	h.checkOrder("calm")
	require.Equal(t, 20, h.status("flood").Backlog)
	// When the flooded partner's endpoint comes back, its backlog drains
	// and intake admits it again.
	// Its backlog counts an event until its row is marked delivered (the
	// mark's commit), a moment after the endpoint has it: wait for both.
	h.eps["flood"].Set(sim.Behavior{})
	require.Eventually(t, func() bool { return h.delivered("flood") && h.status("flood").Backlog == 0 }, waitLong, 5*time.Millisecond)
	// (The 20 were posted concurrently, so they have no order between
	// them; the next ones, posted one by one, must follow them in order.)
	first := len(h.rec.IDs("flood"))
	for i := range 5 {
		c, _ := h.post("flood", 1000+i)
		require.Equal(t, http.StatusAccepted, c)
	}
	require.Eventually(t, func() bool { return h.delivered("flood") }, waitLong, 5*time.Millisecond)
	ids := h.acceptedIDs("flood")
	_, err = sim.CheckOrder(ids[20:], h.rec.IDs("flood")[first:])
	require.NoError(t, err)
}
