package service

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
)

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
	h.eps["flood"].Set(sim.Behavior{})
	require.Eventually(t, func() bool { return h.delivered("flood") }, waitLong, 5*time.Millisecond)
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

// Endpoints that are slow, fail 30% of the time, hang and come back, are
// down and come back: every event arrives, in order per partner, each
// delivery carrying its event ID (the endpoints reject a request without).
func TestDeliveryInOrderThroughFlakyEndpoints(t *testing.T) {
	behaviors := map[string]sim.Behavior{
		"slow":    {Delay: 20 * time.Millisecond},
		"flaky":   {FailRate: 0.3},
		"hangs":   {Hang: true},
		"down":    {Down: true},
		"healthy": {},
	}
	h := newHarness(t, behaviors, nil)
	const n = 40
	for i := range n {
		for p := range behaviors {
			c, _ := h.post(p, i)
			require.Equal(t, http.StatusAccepted, c)
		}
		if i == n/2 {
			// Half-way: the hanging and the down endpoints come back.
			h.eps["hangs"].Set(sim.Behavior{})
			h.eps["down"].Set(sim.Behavior{})
		}
	}
	for p := range behaviors {
		require.Eventually(t, func() bool { return h.delivered(p) }, waitLong, 5*time.Millisecond, p)
	}
	for p := range behaviors {
		dups := h.checkOrder(p)
		t.Logf("%s: %d events, %d duplicates", p, n, dups)
	}
	require.Eventually(t, func() bool {
		for _, s := range h.statuses() {
			if s.Backlog != 0 {
				return false
			}
		}
		return true
	}, waitLong, 5*time.Millisecond)
	st := h.status("flaky")
	require.GreaterOrEqual(t, st.Delivered, uint64(n), "each event delivered (a redelivery counts again)")
	require.NotZero(t, st.Failed, "a 30%% failure rate over %d events failed no attempt", n)
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

// After its attempts run out the partner is parked: its later events are
// accepted and wait, none is dropped; Resume delivers them all in order.
func TestParkedPartnerResumesInOrder(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {Down: true}, "other": {}}, func(c *Config) {
		c.Retry = keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
	})
	for i := range 5 {
		c, _ := h.post("p", i)
		require.Equal(t, http.StatusAccepted, c)
	}
	require.Eventually(t, func() bool { return len(h.parked()) == 1 }, waitLong, 5*time.Millisecond)
	require.Equal(t, []string{"p"}, h.parked())
	for i := 5; i < 10; i++ {
		c, _ := h.post("p", i)
		require.Equal(t, http.StatusAccepted, c)
		c, _ = h.post("other", i)
		require.Equal(t, http.StatusAccepted, c)
	}
	require.Eventually(t, func() bool { return h.delivered("other") }, waitLong, 5*time.Millisecond)
	st := h.status("p")
	require.True(t, st.Parked)
	require.Equal(t, 10, st.Backlog)
	require.Equal(t, uint64(1), st.Parks)
	require.Empty(t, h.rec.IDs("p"))
	require.ErrorIs(t, h.svc.Resume(t.Context(), "other"), ErrNotParked)

	h.eps["p"].Set(sim.Behavior{})
	require.NoError(t, h.svc.Resume(t.Context(), "p"))
	require.Eventually(t, func() bool { return h.delivered("p") }, waitLong, 5*time.Millisecond)
	h.checkOrder("p")
	require.Empty(t, h.parked())
}

func TestSkipGivesUpTheHeadOnly(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {Down: true}}, func(c *Config) {
		c.Retry = keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
	})
	for i := range 4 {
		h.post("p", i)
	}
	require.Eventually(t, func() bool { return len(h.parked()) == 1 }, waitLong, 5*time.Millisecond)
	h.eps["p"].Set(sim.Behavior{})
	require.NoError(t, h.svc.Skip(t.Context(), "p"))
	ids := h.acceptedIDs("p")
	require.Eventually(t, func() bool { return len(h.rec.IDs("p")) >= 3 }, waitLong, 5*time.Millisecond)
	_, err := sim.CheckOrder(ids[1:], h.rec.IDs("p"))
	require.NoError(t, err, "the head was skipped, the rest delivered in order")
	// (The endpoint records a delivery before it answers: the service
	// counts it a moment later.)
	require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond)
	require.Equal(t, uint64(1), h.status("p").Skipped)
	require.ErrorIs(t, h.svc.Skip(t.Context(), "p"), ErrNotParked)
}

// A restart on the same database delivers what the last process left.
func TestRestartDeliversBacklog(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {Down: true}}, nil)
	for i := range 10 {
		h.post("p", i)
	}
	cfg := h.svc.cfg
	h.stop()
	h.eps["p"].Set(sim.Behavior{})
	cfg.Store = nil
	h.start(cfg)
	// One snapshot: backlog and delivered are read under one lock (two
	// status calls raced with the relay and counted a delivery twice).
	st := h.status("p")
	require.Equal(t, 10, st.Backlog+int(st.Delivered))
	require.Eventually(t, func() bool { return h.delivered("p") }, waitLong, 5*time.Millisecond)
	h.checkOrder("p")
}

func TestMetricsServed(t *testing.T) {
	mp, handler, err := NewPrometheus()
	require.NoError(t, err)
	defer mp.Shutdown(context.Background())
	// h's endpoint hangs: its delivery is in flight when /metrics is read,
	// so the relay's scheduler has a task with an age.
	h := newHarness(t, map[string]sim.Behavior{"p": {Down: true}, "q": {}, "h": {Hang: true}}, func(c *Config) {
		c.MeterProvider = mp
		c.MetricsHandler = handler
		c.Retry = keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	})
	for i := range 3 {
		h.post("p", i)
		h.post("q", i)
	}
	h.post("h", 0)
	require.Eventually(t, func() bool { return len(h.parked()) == 1 && h.delivered("q") }, waitLong, 5*time.Millisecond)
	scrape := func() string {
		resp, err := http.Get(h.admin.URL + "/metrics")
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return string(b)
	}
	// The relay's scheduler through otelkeysched's Observer (given with
	// outbox.WithSchedulerOptions): queue wait and attempt duration
	// histograms with samples, and the age of the hanging delivery.
	value := func(body, series string) float64 {
		m := regexp.MustCompile(`(?m)^` + series + `\{[^}]*scheduler="webhook.delivery"[^}]*\} (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			return -1
		}
		v, err := strconv.ParseFloat(m[1], 64)
		require.NoError(t, err)
		return v
	}
	var body string
	require.Eventually(t, func() bool {
		if _, received := h.rec.Total(); received < 6 { // q: 3, p: 2, h: 1 (hanging)
			return false
		}
		body = scrape()
		return value(body, `keysched_tasks_oldest_age_seconds`) > 0
	}, waitLong, 5*time.Millisecond, "the hanging delivery's age")
	require.GreaterOrEqual(t, value(body, `keysched_task_queue_wait_seconds_count`), 5.0, "a queue wait per delivery started (q: 3, p: 1 then parked, h: 1)")
	require.GreaterOrEqual(t, value(body, `keysched_task_duration_seconds_count`), 1.0, "attempt durations")
	require.Regexp(t, `keysched_task_duration_seconds_count\{[^}]*outcome="succeeded"[^}]*\} [3-9]`, body)
	require.Regexp(t, `keysched_task_duration_seconds_count\{[^}]*outcome="failed"[^}]*\} [2-9]`, body)
	require.Contains(t, body, `keysched_task_queue_wait_seconds_bucket{`)
	require.Contains(t, body, `keysched_task_duration_seconds_bucket{`)
	h.eps["h"].Set(sim.Behavior{})
	for _, want := range []string{
		`webhook_partner_backlog{otel_scope_name="github.com/keysched/keysched/examples/webhook"`,
		`webhook_partner_parked{`,
		`webhook_deliveries_total{`,
		`webhook_partner_parks_total{`,
		`webhook_intake_events_total{`,
		`webhook_delivery_latency_seconds_bucket{`,
		// The relay's scheduler, through otelkeysched.
		`keysched_tasks_pending{`,
		`keysched_keys_live{`,
		`keysched_tasks_retried_total{`,
	} {
		require.Contains(t, body, want)
	}
	require.Regexp(t, `webhook_partner_backlog\{[^}]*partner="p"[^}]*\} 3\n`, body)
	require.Regexp(t, `webhook_partner_parked\{[^}]*partner="p"[^}]*\} 1\n`, body)
	require.Regexp(t, `webhook_partner_parks_total\{[^}]*partner="p"[^}]*\} 1\n`, body)
	require.Regexp(t, `webhook_deliveries_total\{[^}]*partner="q",result="delivered"[^}]*\} [3-9]\n`, body) // 3, or more with a redelivery
}

func TestIntakeAfterCloseFailsClearly(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {}}, nil)
	require.NoError(t, h.svc.Close(t.Context()))
	c, _ := h.post("p", 1)
	require.Equal(t, http.StatusServiceUnavailable, c)
	require.NoError(t, h.svc.Close(t.Context()), "Close is idempotent")
	require.ErrorIs(t, h.svc.Resume(t.Context(), "p"), ErrClosed)
	require.ErrorIs(t, h.svc.Skip(t.Context(), "p"), ErrClosed)
}

// Found by attacking the code: Resume, Skip and a parked event's Replay
// that passed the service's own closed check while Close was stopping the
// relay got the outbox's "relay closed": not ErrClosed, and a 500 on the
// admin endpoints instead of 503. The relay is closed here first, as Close
// does, with the service not yet marked closed.
func TestOperatorActionsRacingCloseAnswerClosed(t *testing.T) {
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusGone, "gone" })
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) {
		c.Partners = map[string]string{"p": ep.srv.URL}
		c.Retry = keysched.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	})
	_, e0 := h.post("p", 0)
	require.Eventually(t, func() bool { return h.event(e0).State == StateParked }, waitLong, 5*time.Millisecond)
	ctx := context.Background()
	require.NoError(t, h.svc.relay.r.Close(ctx))
	require.ErrorIs(t, h.svc.Resume(ctx, "p"), ErrClosed)
	require.ErrorIs(t, h.svc.Skip(ctx, "p"), ErrClosed)
	_, err := h.svc.Replay(ctx, e0)
	require.ErrorIs(t, err, ErrClosed)
	code, body := adminForm(t, h.admin.URL+"/events/"+e0+"/replay", nil, nil)
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	code, body = adminForm(t, h.admin.URL+"/partners/p/resume", nil, nil)
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Equal(t, StateParked, h.event(e0).State, "nothing moved")
}
