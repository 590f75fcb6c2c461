package service

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
)

func adminForm(t *testing.T, u string, form url.Values, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A replay of a delivered event sends it again through the partner's chain:
// after the partner's undelivered events (in order with them), with the
// same Webhook-Id and the same body byte for byte; it is logged, counted,
// and shown in the event's lookup. A pending event is left as is. A
// cross-origin replay is refused and replays nothing.
func TestReplaySendsAgainInOrderWithSameID(t *testing.T) {
	mp, handler, err := NewPrometheus()
	require.NoError(t, err)
	defer mp.Shutdown(context.Background())
	logs := &syncBuffer{}
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusNoContent, "" })
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) {
		c.Partners = map[string]string{"p": ep.srv.URL}
		c.MeterProvider, c.MetricsHandler = mp, handler
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
		c.Retry = keysched.RetryPolicy{MaxAttempts: 1000, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
	})
	_, e0 := h.post("p", 0)
	_, e1 := h.post("p", 1)
	require.Eventually(t, func() bool { ids, _ := ep.received(); return len(ids) == 2 }, waitLong, 5*time.Millisecond)
	require.Eventually(t, func() bool {
		return h.event(e0).State == StateDelivered && h.event(e1).State == StateDelivered
	}, waitLong, 5*time.Millisecond)

	// The endpoint fails for a while: e2 and e3 wait, retried.
	ep.set(func(int, string) (int, string) { return http.StatusServiceUnavailable, "down" })
	_, e2 := h.post("p", 2)
	_, e3 := h.post("p", 3)
	require.Eventually(t, func() bool { return len(h.event(e3).Attempts) == 0 && len(h.event(e2).Attempts) > 0 }, waitLong, 5*time.Millisecond)

	// Cross-origin: refused, nothing replayed.
	code, _ := adminForm(t, h.admin.URL+"/events/"+e0+"/replay", nil, map[string]string{"Sec-Fetch-Site": "cross-site"})
	require.Equal(t, http.StatusForbidden, code)
	require.Empty(t, h.event(e0).Replays)

	code, body := adminForm(t, h.admin.URL+"/events/"+e0+"/replay", nil, nil)
	require.Equal(t, http.StatusOK, code, body)
	var res ReplayResult
	require.NoError(t, json.Unmarshal([]byte(body), &res))
	require.Equal(t, []string{e0}, res.Requeued)
	res2, err := h.svc.Replay(context.Background(), e2)
	require.NoError(t, err)
	require.Equal(t, []string{e2}, res2.Pending, "a pending event is not sent twice")
	require.Empty(t, res2.Requeued)
	require.Equal(t, 3, h.status("p").Backlog, "e2, e3 and the replay of e0")

	ep.set(func(int, string) (int, string) { return http.StatusNoContent, "" })
	require.Eventually(t, func() bool { ids, _ := ep.received(); return len(ids) == 5 }, waitLong, 5*time.Millisecond)
	ids, bodies := ep.received()
	require.Equal(t, []string{e0, e1, e2, e3, e0}, ids, "the replay after the partner's waiting events")
	require.True(t, bytes.Equal(bodies[0], bodies[4]), "the same body:\n%s\n%s", bodies[0], bodies[4])
	require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond)

	// The outbox marks a delivered row sent just after the delivery
	// (its flusher batches the marks): "pending" with a delivered attempt
	// until then.
	require.Eventually(t, func() bool { return h.event(e0).State == StateDelivered }, waitLong, 5*time.Millisecond)
	ev := h.event(e0)
	require.Len(t, ev.Replays, 1)
	require.Equal(t, StateDelivered, ev.Replays[0].State)
	require.Len(t, ev.Attempts, 2)
	require.Empty(t, ev.Attempts[0].Replay)
	require.Equal(t, ev.Replays[0].ID, ev.Attempts[1].Replay)
	require.Equal(t, "delivered", ev.Attempts[1].Outcome)
	require.Contains(t, logs.String(), `msg="operator replayed an event" event=`+e0)

	resp, err := http.Get(h.admin.URL + "/metrics")
	require.NoError(t, err)
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Regexp(t, `webhook_replays_total\{[^}]*partner="p",result="requeued"[^}]*\} 1\n`, string(m))
	require.Regexp(t, `webhook_partner_enqueued_total\{[^}]*partner="p"[^}]*\} 5\n`, string(m))
	require.Regexp(t, `webhook_partner_settled_total\{[^}]*partner="p"[^}]*\} 5\n`, string(m))
	require.True(t, strings.Contains(string(m), `webhook_partner_backlog_slope_per_second{`), "the slope gauge")
}

// A partner's events in a time range are replayed in their order, whatever
// their state: a parked one (out of attempts) is retried (its partner
// resumes), the delivered ones are sent again behind it. A replay survives
// a restart. Bad ranges and partners are refused clearly.
func TestReplayRangeRecoversParkedAndRequeuesDelivered(t *testing.T) {
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusNoContent, "" })
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) {
		c.Partners = map[string]string{"p": ep.srv.URL}
		c.Retry = keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	})
	from := time.Now().Add(-time.Second)
	posted := h.postDelivered("p", 2)
	e0, e1 := posted[0], posted[1]
	ep.set(func(int, string) (int, string) { return http.StatusGone, "gone" })
	_, e2 := h.post("p", 2)
	require.Eventually(t, func() bool { return len(h.parked()) == 1 }, waitLong, 5*time.Millisecond)
	to := time.Now().Add(time.Second)
	_, e3 := h.post("p", 3) // after the range, waits behind the parked e2

	// Replayed while the endpoint still fails, then restarted: the
	// replays are in the database.
	res, err := h.svc.ReplayRange(context.Background(), "p", from, to)
	require.NoError(t, err)
	require.Equal(t, []string{e0, e1}, res.Requeued)
	require.Equal(t, []string{e2}, res.Recovered)
	require.Eventually(t, func() bool { return len(h.parked()) == 1 }, waitLong, 5*time.Millisecond, "e2 fails again")
	cfg := h.svc.cfg
	h.stop()
	cfg.Store = nil
	ep.set(func(int, string) (int, string) { return http.StatusNoContent, "" })
	h.start(cfg)
	require.Equal(t, 4, h.status("p").Backlog, "e2, e3, and the replays of e0 and e1, after the restart")
	_, err = h.svc.Replay(context.Background(), e2)
	require.NoError(t, err)
	require.Eventually(t, func() bool { ids, _ := ep.received(); return len(ids) == 6 }, waitLong, 5*time.Millisecond)
	ids, _ := ep.received()
	require.Equal(t, []string{e0, e1, e2, e3, e0, e1}, ids)
	require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond)

	for name, form := range map[string]url.Values{
		"reversed": {"from": {to.UTC().Format(time.RFC3339Nano)}, "to": {from.UTC().Format(time.RFC3339Nano)}},
		"missing":  {"from": {from.UTC().Format(time.RFC3339Nano)}},
		"garbage":  {"from": {"yesterday"}, "to": {"today"}},
		"empty":    {"from": {"2001-01-01T00:00"}, "to": {"2001-01-02T00:00"}},
	} {
		code, body := adminForm(t, h.admin.URL+"/partners/p/replay", form, nil)
		require.Equal(t, http.StatusBadRequest, code, "%s: %s", name, body)
		require.Contains(t, body, "error", name)
	}
	code, _ := adminForm(t, h.admin.URL+"/partners/nobody/replay", url.Values{"from": {"2001-01-01T00:00"}, "to": {"2001-01-02T00:00"}}, nil)
	require.Equal(t, http.StatusNotFound, code)
	code, _ = adminForm(t, h.admin.URL+"/events/nothing/replay", nil, nil)
	require.Equal(t, http.StatusNotFound, code)
}

// A range of more than MaxReplay events is refused whole, naming the count
// the range holds (it named MaxReplay+1, the query's limit): nothing is
// replayed (no partial run).
func TestReplayRangeRefusesTooMany(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {}}, nil)
	ctx := context.Background()
	tx, err := h.store.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	base := time.Now().Add(-time.Hour)
	const held = MaxReplay + 500 // the count named is the range's, not the query's limit + 1
	for i := range held {
		_, err := tx.ExecContext(ctx, h.store.rebind(`INSERT INTO `+h.store.intake+` (id, partner, type, received_at) VALUES (?, 'p', 't', ?)`),
			fmt.Sprintf("old-%04d", i), base.Add(time.Duration(i)*time.Millisecond).UnixMicro())
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
	_, err = h.svc.ReplayRange(ctx, "p", base, base.Add(time.Minute))
	require.ErrorIs(t, err, ErrReplayTooMany)
	require.ErrorContains(t, err, fmt.Sprintf(": %d events in [", held))
	var n int
	require.NoError(t, h.store.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+h.store.replay).Scan(&n))
	require.Zero(t, n)
	res, err := h.svc.ReplayRange(ctx, "p", base, base.Add(time.Duration(MaxReplay)*time.Millisecond))
	require.NoError(t, err)
	require.Len(t, res.Expired, MaxReplay, "no payload in the outbox for these: past retention")
	require.Empty(t, res.Requeued)
}

// Found by attacking the code: an event whose delivered row the retention
// deleted between the replay's read of its candidates and its write (a
// trigger here deletes it in the write's own transaction, after the first
// replay row) failed the whole range with "payload of ...: no rows" and
// replayed nothing. It is now reported as expired, and the others are sent.
func TestReplayReportsRowsTheRetentionDeletesMeanwhileAsExpired(t *testing.T) {
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusNoContent, "" })
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) {
		c.Partners = map[string]string{"p": ep.srv.URL}
	})
	from := time.Now().Add(-time.Second)
	posted := h.postDelivered("p", 2)
	e0, e1 := posted[0], posted[1]
	ctx := context.Background()
	tbl := h.store.ob.Table()
	_, err := h.store.db.ExecContext(ctx, fmt.Sprintf(`CREATE TRIGGER retention_meanwhile AFTER INSERT ON %s
WHEN NEW.id NOT IN ('%s', '%s') BEGIN DELETE FROM %s WHERE id = '%s'; END`, tbl, e0, e1, tbl, e1))
	require.NoError(t, err)
	res, err := h.svc.ReplayRange(ctx, "p", from, time.Now().Add(time.Second))
	require.NoError(t, err)
	require.Equal(t, []string{e0}, res.Requeued)
	require.Equal(t, []string{e1}, res.Expired)
	require.Eventually(t, func() bool { ids, _ := ep.received(); return len(ids) == 3 }, waitLong, 5*time.Millisecond)
	ids, _ := ep.received()
	require.Equal(t, []string{e0, e1, e0}, ids)
	require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond, "the left-out replay row is not counted")
}

// Found by attacking the code: two replays of one delivered event at once
// (a double click on the Replay button, two operators) both read the event
// as delivered before either wrote, and both sent it again: the partner got
// it twice more, while a replay is meant to leave an event with a pending
// delivery as is. The hook runs the second replay between the first's read
// and its write; the first now finds the second's delivery pending in its
// write transaction and leaves the event as is. SQLite and PostgreSQL.
func TestConcurrentReplaysOfOneEventSendItOnce(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) func() (*Store, error){
		"sqlite":   func(t *testing.T) func() (*Store, error) { return nil },
		"postgres": postgresStore,
	} {
		t.Run(name, func(t *testing.T) {
			ep := newScripted(t, func(int, string) (int, string) { return http.StatusNoContent, "" })
			mod := func(c *Config) { c.Partners = map[string]string{"p": ep.srv.URL} }
			var h *harness
			if o := open(t); o != nil {
				h = newHarnessOn(t, o, nil, mod)
			} else {
				h = newHarness(t, nil, mod)
			}
			_, e0 := h.post("p", 0)
			require.Eventually(t, func() bool { return h.event(e0).State == StateDelivered }, waitLong, 5*time.Millisecond)
			// The backlog forgets e0 after its mark commits
			// (AfterMarkCommit), a moment after the lookup sees it
			// delivered: wait, or the count below can read 2.
			require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond)
			// Hold the replays' deliveries: the endpoint fails.
			ep.set(func(int, string) (int, string) { return http.StatusServiceUnavailable, "down" })
			ctx := context.Background()
			var second ReplayResult
			h.svc.beforeRequeue = func() {
				h.svc.beforeRequeue = nil
				var err error
				second, err = h.svc.Replay(ctx, e0)
				require.NoError(t, err)
			}
			first, err := h.svc.Replay(ctx, e0)
			require.NoError(t, err)
			require.Equal(t, []string{e0}, second.Requeued)
			require.Empty(t, first.Requeued, "sent again once, by the second")
			require.Equal(t, []string{e0}, first.Pending)
			require.Len(t, h.event(e0).Replays, 1)
			require.Equal(t, 1, h.status("p").Backlog)
			ep.set(func(int, string) (int, string) { return http.StatusNoContent, "" })
			require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond)
			ids, _ := ep.received()
			n := 0
			for _, id := range ids {
				if id == e0 {
					n++
				}
			}
			require.Equal(t, 2, n, "the event and one replay delivered")
		})
	}
}

// A partner replay's log line gives each outcome's count and its first
// logIDs event IDs, not every ID (a replay may hold 1,000 events); the
// answer lists them all.
func TestReplayRangeLogsCountsAndFirstIDs(t *testing.T) {
	logs := &syncBuffer{}
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusNoContent, "" })
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) {
		c.Partners = map[string]string{"p": ep.srv.URL}
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	from := time.Now().Add(-time.Second)
	const n = logIDs + 2
	ids := make([]string, n)
	for i := range ids {
		_, ids[i] = h.post("p", i)
	}
	require.Eventually(t, func() bool { got, _ := ep.received(); return len(got) == n }, waitLong, 5*time.Millisecond)
	require.Eventually(t, func() bool { return h.event(ids[n-1]).State == StateDelivered }, waitLong, 5*time.Millisecond)
	res, err := h.svc.ReplayRange(context.Background(), "p", from, time.Now().Add(time.Second))
	require.NoError(t, err)
	require.Equal(t, ids, res.Requeued, "the answer lists every ID")

	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "operator replayed a partner's events") {
			line = l
		}
	}
	require.NotEmpty(t, line, logs.String())
	require.Contains(t, line, fmt.Sprintf("requeued.count=%d requeued.first=\"[%s]\"", n, strings.Join(ids[:logIDs], " ")))
	require.Contains(t, line, "recovered.count=0")
	for _, id := range ids[logIDs:] {
		require.NotContains(t, line, id, "past the first %d IDs", logIDs)
	}
}
