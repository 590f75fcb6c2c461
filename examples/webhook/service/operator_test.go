package service

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
)

// noRedirect is a client that returns the operator actions' 303 as is.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func adminPost(t *testing.T, url string, hdr map[string]string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, nil)
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := noRedirect.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// Found by attacking the code (adversarial review of the service: first written as a failing reproducer).
//
// The admin handler has no authentication, and its actions were plain POST
// forms: a page on any site, opened in an operator's browser, could post
// /partners/{p}/skip to the loopback admin address and give an event up
// (cross-site request forgery; a form post needs no CORS preflight). Now
// cross-origin posts are refused with 403 and change nothing.
func TestOperatorActionsRefuseCrossOrigin(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {Down: true}}, func(c *Config) {
		c.Retry = keysched.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	})
	h.post("p", 0)
	h.post("p", 1)
	require.Eventually(t, func() bool { return len(h.parked()) == 1 }, waitLong, 5*time.Millisecond)
	skip := h.admin.URL + "/partners/p/skip"
	for _, hdr := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site"},
		{"Sec-Fetch-Site": "same-site"},
		{"Origin": "https://evil.example"},
	} {
		require.Equal(t, http.StatusForbidden, adminPost(t, skip, hdr), "%v", hdr)
		require.Equal(t, http.StatusForbidden, adminPost(t, h.admin.URL+"/partners/p/resume", hdr), "%v", hdr)
	}
	require.Equal(t, []string{"p"}, h.parked(), "still parked")
	require.Equal(t, 2, h.status("p").Backlog, "nothing skipped")
	require.Zero(t, h.status("p").Skipped)
	// The page's own form (same origin) and a script without browser
	// headers still work.
	require.Equal(t, http.StatusSeeOther, adminPost(t, skip, map[string]string{"Sec-Fetch-Site": "same-origin"}))
	require.Equal(t, uint64(1), h.status("p").Skipped)
	require.Eventually(t, func() bool { return len(h.parked()) == 1 && h.status("p").Backlog == 1 }, waitLong, 5*time.Millisecond)
	require.Equal(t, http.StatusSeeOther, adminPost(t, skip, nil))
	require.Equal(t, uint64(2), h.status("p").Skipped)
}

// Found by attacking the code (adversarial review of the service: first written as a failing reproducer).
//
// Skip read the partner's head (its oldest dead row), then asked the outbox
// to skip "the oldest dead row": two statements. If, between them, the head
// was resumed, delivered, and the next event died (a Resume pressed in
// another tab, a retry budget of 1), the outbox skipped that next event
// while the service logged and uncounted the first one: an event given up
// in the name of another, and a backlog that counted the skipped event for
// ever. The hook forces that interleaving.
func TestSkipRacingResumeSkipsAndReportsOneEvent(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "webhook.db")
		testSkipRacingResume(t, func() (*Store, error) { return OpenSQLite(t.Context(), path) })
	})
	t.Run("postgres", func(t *testing.T) { testSkipRacingResume(t, postgresStore(t)) })
}

func testSkipRacingResume(t *testing.T, open func() (*Store, error)) {
	var (
		mu      sync.Mutex
		okID    string // the one event the endpoint accepts
		arrived = map[string]int{}
	)
	ep := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(HeaderID)
		mu.Lock()
		defer mu.Unlock()
		if id != okID {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		arrived[id]++
		w.WriteHeader(http.StatusNoContent)
	}))
	defer ep.Close()
	logs := &syncBuffer{}
	h := newHarnessOn(t, open, map[string]sim.Behavior{}, func(c *Config) {
		c.Partners = map[string]string{"p": ep.URL}
		c.Retry = keysched.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	_, x := h.post("p", 0)
	_, y := h.post("p", 1)
	head := func() string {
		id, err := h.store.parkedHead(context.Background(), "p")
		if err != nil {
			return ""
		}
		return id
	}
	require.Eventually(t, func() bool { return head() == x }, waitLong, 5*time.Millisecond)
	h.svc.relay.beforeSkip = func(string) {
		// Another operator resumes x; it is delivered; y dies.
		mu.Lock()
		okID = x
		mu.Unlock()
		require.NoError(t, h.svc.Resume(context.Background(), "p"))
		require.Eventually(t, func() bool { return head() == y }, waitLong, 5*time.Millisecond)
	}
	err := h.svc.Skip(context.Background(), "p")
	h.svc.relay.beforeSkip = nil
	var skipped []string
	rows, qerr := h.store.db.Query(`SELECT id FROM ` + h.store.Outbox().Table() + ` WHERE state = 3`)
	require.NoError(t, qerr)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		skipped = append(skipped, id)
	}
	require.NoError(t, rows.Close())
	var undelivered int
	require.NoError(t, h.store.db.QueryRow(`SELECT COUNT(*) FROM `+h.store.Outbox().Table()+` WHERE state IN (0, 2)`).Scan(&undelivered))
	// Whatever Skip decided, the backlog is the database's, and what was
	// logged as skipped is what the outbox marked skipped.
	require.Equal(t, undelivered, h.status("p").Backlog, "backlog in memory vs undelivered rows (Skip returned %v)", err)
	for _, id := range skipped {
		require.Contains(t, logs.String(), "event="+id, "the skipped event is the one logged")
	}
	if err == nil {
		require.Len(t, skipped, 1)
	} else {
		require.ErrorIs(t, err, ErrNotParked)
		require.Empty(t, skipped)
	}
}

// parkedHead returns the ID of the partner's oldest dead outbox row (the one
// Skip gives up next).
func (s *Store) parkedHead(ctx context.Context, partner string) (string, error) {
	var id string
	err := s.db.QueryRowContext(ctx, s.rebind(`SELECT id FROM `+s.ob.Table()+` WHERE key = ? AND state = 2 ORDER BY seq LIMIT 1`), partner).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ErrNotParked
	}
	return id, err
}

// Found by attacking the code (adversarial review of the service: first written as a failing reproducer).
//
// The page's confirmation line came from the query string as is: any link
// (?done=...) made the operator page state anything in its own voice (the
// text was escaped, but it was the page speaking). Only the actions' own
// confirmations for a configured partner are shown now.
func TestOperatorPageFlashOnlyFromActions(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {}}, nil)
	page := func(done string) string {
		resp, err := http.Get(h.admin.URL + "/?done=" + url.QueryEscape(done))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return string(b)
	}
	for _, bad := range []string{"all events delivered, nothing to do", "resumed nobody", "resumed p and everyone", "skipped the head event of "} {
		require.NotContains(t, page(bad), `id="flash"`, bad)
	}
	require.Contains(t, page("resumed p"), `<strong id="flash">resumed p</strong>`)
	require.Contains(t, page("skipped the head event of p"), `<strong id="flash">skipped the head event of p</strong>`)
}
