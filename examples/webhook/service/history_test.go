package service

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
)

// scripted is an endpoint whose answers a test scripts: answer(n, id) gives
// the status and body of the n-th request (from 0). It records each
// request's Webhook-Id and body, in arrival order.
type scripted struct {
	srv    *httptest.Server
	mu     sync.Mutex
	n      int
	answer func(n int, id string) (int, string)
	ids    []string
	bodies [][]byte
}

func newScripted(t *testing.T, answer func(n int, id string) (int, string)) *scripted {
	s := &scripted{answer: answer}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := make([]byte, 0, 512)
		buf := make([]byte, 512)
		for {
			k, err := r.Body.Read(buf)
			body = append(body, buf[:k]...)
			if err != nil {
				break
			}
		}
		s.mu.Lock()
		n, answer := s.n, s.answer
		s.n++
		s.mu.Unlock()
		code, text := answer(n, r.Header.Get(HeaderID))
		if code >= 200 && code < 300 {
			s.mu.Lock()
			s.ids = append(s.ids, r.Header.Get(HeaderID))
			s.bodies = append(s.bodies, body)
			s.mu.Unlock()
		}
		w.WriteHeader(code)
		_, _ = w.Write([]byte(text))
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *scripted) set(answer func(n int, id string) (int, string)) {
	s.mu.Lock()
	s.answer = answer
	s.mu.Unlock()
}

// received returns the IDs and bodies answered 2xx, in arrival order.
func (s *scripted) received() ([]string, [][]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ids...), append([][]byte(nil), s.bodies...)
}

func (h *harness) event(id string) EventInfo {
	h.t.Helper()
	ev, err := h.svc.Event(context.Background(), id)
	require.NoError(h.t, err)
	return ev
}

// Every attempt is recorded with its time, duration, status or transport
// error, the first AttemptBodyBytes of the response, and the relay that
// made it; GET /events/{id} shows them with the event's state and
// delivered-at.
func TestAttemptHistoryRecordsEveryAttempt(t *testing.T) {
	long := strings.Repeat("e", 2*AttemptBodyBytes)
	ep := newScripted(t, func(n int, _ string) (int, string) {
		if n < 2 {
			return http.StatusInternalServerError, "boom " + long
		}
		return http.StatusOK, `{"ok":true}`
	})
	// A port nothing listens on: every call is a transport error.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) {
		c.Partners = map[string]string{"p": ep.srv.URL, "gone": gone}
		c.RelayName = "relay-a"
	})
	_, id := h.post("p", 0)
	_, goneID := h.post("gone", 0)

	require.Eventually(t, func() bool { return h.event(id).State == StateDelivered }, waitLong, 5*time.Millisecond)
	ev := h.event(id)
	require.Equal(t, "p", ev.Partner)
	require.Equal(t, "test.event", ev.Type)
	require.Len(t, ev.Attempts, 3)
	for i, a := range ev.Attempts[:2] {
		require.Equal(t, "failed", a.Outcome, i)
		require.Equal(t, http.StatusInternalServerError, a.Status)
		require.Contains(t, a.Error, "500")
		require.Len(t, a.Body, AttemptBodyBytes, "the body's first bytes, bounded")
		require.True(t, strings.HasPrefix(a.Body, "boom eee"))
		require.Equal(t, "relay-a", a.Relay)
		require.Positive(t, a.Duration)
	}
	last := ev.Attempts[2]
	require.Equal(t, "delivered", last.Outcome)
	require.Equal(t, http.StatusOK, last.Status)
	require.Empty(t, last.Error)
	require.Equal(t, `{"ok":true}`, last.Body)
	require.NotNil(t, ev.DeliveredAt)
	require.False(t, ev.DeliveredAt.Before(last.At))
	require.True(t, ev.Attempts[0].At.Before(ev.Attempts[1].At))

	require.Eventually(t, func() bool { return len(h.event(goneID).Attempts) >= 2 }, waitLong, 5*time.Millisecond)
	g := h.event(goneID)
	require.Equal(t, StatePending, g.State)
	require.Zero(t, g.Attempts[0].Status)
	require.Contains(t, g.Attempts[0].Error, "connect")

	// The API.
	resp, err := http.Get(h.admin.URL + "/events/" + id)
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	for _, k := range []string{"partner", "type", "created", "state", "attempts", "delivered_at"} {
		require.Contains(t, got, k)
	}
	require.Equal(t, "delivered", got["state"])
	require.Len(t, got["attempts"], 3)
	// Each attempt's duration in nanoseconds ("duration") and in
	// milliseconds ("duration_ms", a float): the same time.
	for _, a := range got["attempts"].([]any) {
		at := a.(map[string]any)
		ns, ok := at["duration"].(float64)
		require.True(t, ok, "duration: %v", at)
		ms, ok := at["duration_ms"].(float64)
		require.True(t, ok, "duration_ms: %v", at)
		require.Positive(t, ms)
		require.InDelta(t, ns/1e6, ms, 1e-6)
	}
	resp, err = http.Get(h.admin.URL + "/events/no-such-event")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// A delivered attempt is recorded in the transaction that marks its row
// sent: when the record cannot be written (the attempt table is gone), the
// mark fails with it. The row stays pending and counted, nothing is on
// record, and the relay marks it again (without delivering it again) until
// the table is back: then the one delivery is on record and the row marked.
func TestAttemptNotRecordedLeavesEventPending(t *testing.T) {
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusNoContent, "" })
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) {
		c.Partners = map[string]string{"p": ep.srv.URL}
		c.Retry = keysched.RetryPolicy{MaxAttempts: 1000, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
		c.PollInterval = 20 * time.Millisecond
	})
	ctx := context.Background()
	_, err := h.store.db.ExecContext(ctx, `ALTER TABLE `+h.store.attempt+` RENAME TO moved_away`)
	require.NoError(t, err)
	_, id := h.post("p", 0)
	require.Eventually(t, func() bool {
		ids, _ := ep.received()
		return len(ids) == 1 && h.svc.relay.r.Stats().DBErrors >= 3
	}, waitLong, 5*time.Millisecond, "delivered, then its mark (with the attempt) failed three times")
	var state int
	require.NoError(t, h.store.db.QueryRowContext(ctx, `SELECT state FROM `+h.store.ob.Table()+` WHERE id = '`+id+`'`).Scan(&state))
	require.Zero(t, state, "not marked sent without its attempt on record")
	require.Equal(t, 1, h.status("p").Backlog)
	_, err = h.store.db.ExecContext(ctx, `ALTER TABLE moved_away RENAME TO `+h.store.attempt)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return h.event(id).State == StateDelivered }, waitLong, 5*time.Millisecond)
	// The backlog forgets the event after its mark commits
	// (AfterMarkCommit), a moment after the state reads Delivered (CI
	// once read 1 here).
	require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond)
	require.Len(t, h.event(id).Attempts, 1)
	ids, _ := ep.received()
	require.Len(t, ids, 1, "marked again, not delivered again")
}

// The history is kept for Config.History: the cleanup deletes older
// attempts; the event's lookup still gives its state (the delivered row is
// kept as long, for replays). A History under a minute is refused.
func TestAttemptHistoryCleanup(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {}}, nil)
	_, id := h.post("p", 0)
	require.Eventually(t, func() bool { return h.event(id).State == StateDelivered }, waitLong, 5*time.Millisecond)
	require.Len(t, h.event(id).Attempts, 1)
	ctx := context.Background()
	n, err := h.store.cleanupHistory(ctx, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	require.Zero(t, n, "nothing older than the cutoff")
	n, err = h.store.cleanupHistory(ctx, time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	ev := h.event(id)
	require.Empty(t, ev.Attempts)
	require.Equal(t, StateDelivered, ev.State)
	require.NotNil(t, ev.DeliveredAt, "from the outbox's kept row")

	cfg := quickConfig()
	cfg.Partners, cfg.Store, cfg.History = map[string]string{"p": "http://127.0.0.1:1"}, h.store, 30*time.Second
	_, err = New(ctx, cfg)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// Found by attacking the code: GET /events/%FF (invalid UTF-8) or
// /events/a%00b (a NUL byte), and their page and replay, answered 500 with
// PostgreSQL's "invalid byte sequence" (SQLite answered 404). An ID no event
// can have (not UTF-8 text, or longer than an outbox ID) is now an unknown
// event on both databases, and a huge one is not echoed whole; SQL-ish and
// path-like IDs are plain unknown IDs.
func TestEventLookupAndReplayAnswerNotFoundForImpossibleIDs(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) func() (*Store, error){
		"sqlite":   func(t *testing.T) func() (*Store, error) { return nil },
		"postgres": postgresStore,
	} {
		t.Run(name, func(t *testing.T) {
			mod := func(c *Config) { c.Partners = map[string]string{"p": "http://127.0.0.1:1"} }
			var h *harness
			if o := open(t); o != nil {
				h = newHarnessOn(t, o, nil, mod)
			} else {
				h = newHarness(t, nil, mod)
			}
			huge := strings.Repeat("a", 100000)
			for _, id := range []string{"%FF", "a%00b", "'%20OR%201=1--", "..%2F..%2Fmetrics", huge} {
				for _, u := range []string{"/events/" + id, "/ui/events/" + id} {
					resp, err := http.Get(h.admin.URL + u)
					require.NoError(t, err)
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					require.Equal(t, http.StatusNotFound, resp.StatusCode, "GET %.60s: %.200s", u, body)
					require.Less(t, len(body), 1000, "GET %.60s: the ID echoed whole", u)
				}
				code, body := adminForm(t, h.admin.URL+"/events/"+id+"/replay", nil, nil)
				require.Equal(t, http.StatusNotFound, code, "replay %.60s: %.200s", id, body)
			}
		})
	}
}

// A partner's response body (and the error made from it) is recorded and
// shown on the operator pages: it is the partner's text, escaped, never
// markup of the page (tried while attacking the code: it held).
func TestOperatorPagesEscapeAPartnersResponseBody(t *testing.T) {
	evil := `<script>alert(1)</script><img src=x onerror=alert(2)>`
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusInternalServerError, evil })
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) {
		c.Partners = map[string]string{"p": ep.srv.URL}
		c.Retry = keysched.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	})
	_, id := h.post("p", 0)
	require.Eventually(t, func() bool { return len(h.parked()) == 1 }, waitLong, 5*time.Millisecond)
	require.Equal(t, evil, h.event(id).Attempts[0].Body)
	for _, u := range []string{"/", "/ui/partners/p", "/ui/events/" + id} {
		resp, err := http.Get(h.admin.URL + u)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NotContains(t, string(b), "<script", u)
		require.NotContains(t, string(b), "<img", u)
		if strings.HasPrefix(u, "/ui/events/") {
			require.Contains(t, string(b), "&lt;script&gt;", u)
		}
	}
}
