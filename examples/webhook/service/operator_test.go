package service

import (
	"context"
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
	require.Equal(t, http.StatusSeeOther, adminPost(t, skip+"?event="+url.QueryEscape(h.head("p")), map[string]string{"Sec-Fetch-Site": "same-origin"}))
	require.Equal(t, uint64(1), h.status("p").Skipped)
	require.Eventually(t, func() bool { return len(h.parked()) == 1 && h.status("p").Backlog == 1 }, waitLong, 5*time.Millisecond)
	require.Equal(t, http.StatusSeeOther, adminPost(t, skip+"?event="+url.QueryEscape(h.head("p")), nil))
	require.Equal(t, uint64(2), h.status("p").Skipped)
}

// Found by attacking the code (adversarial review of the service: first written as a failing reproducer).
//
// Skip read the partner's head (its oldest dead row), then asked the outbox
// to skip "the oldest dead row": two statements. If, between them, the head
// was resumed, delivered, and the next event died (a Resume pressed in
// another tab, a retry budget of 1), the outbox skipped that next event
// while the service logged and uncounted the first one. SkipHead (one
// statement) fixed the count, but still gave up whatever the head was when
// it ran: an operator who saw x on the page, pressed Skip a moment after x
// was resumed and delivered, gave up y, an event never shown. Skip now takes
// the head seen and gives up only that one: here it is refused
// (ErrHeadChanged naming y; on the admin API 409 with the message), nothing
// is skipped, the backlog is the database's; skipping y, once seen, works.
// The hook forces the interleaving.
func TestSkipOfAHeadResumedMeanwhileIsRefused(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "webhook.db")
		testSkipOfAHeadResumedMeanwhile(t, func() (*Store, error) { return OpenSQLite(t.Context(), path) })
	})
	t.Run("postgres", func(t *testing.T) { testSkipOfAHeadResumedMeanwhile(t, postgresStore(t)) })
}

func testSkipOfAHeadResumedMeanwhile(t *testing.T, open func() (*Store, error)) {
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
	require.Eventually(t, func() bool { return h.head("p") == x }, waitLong, 5*time.Millisecond)
	seen := h.head("p") // what the operator page shows
	resumeMeanwhile := func(string) {
		// Another operator resumes x; it is delivered; y dies.
		mu.Lock()
		okID = x
		mu.Unlock()
		require.NoError(t, h.svc.Resume(context.Background(), "p"))
		require.Eventually(t, func() bool { return h.head("p") == y }, waitLong, 5*time.Millisecond)
	}
	h.svc.relay.beforeSkip = resumeMeanwhile
	err := h.svc.Skip(context.Background(), "p", seen)
	h.svc.relay.beforeSkip = nil
	require.ErrorIs(t, err, ErrHeadChanged)
	require.Contains(t, err.Error(), y, "names the current head")
	skippedRows := func() []string {
		var skipped []string
		rows, qerr := h.store.db.Query(`SELECT id FROM ` + h.store.Outbox().Table() + ` WHERE state = 3`)
		require.NoError(t, qerr)
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			skipped = append(skipped, id)
		}
		require.NoError(t, rows.Close())
		return skipped
	}
	require.Empty(t, skippedRows(), "an event never shown was given up")
	require.Equal(t, y, h.head("p"), "y still parked")
	var undelivered int
	require.NoError(t, h.store.db.QueryRow(`SELECT COUNT(*) FROM `+h.store.Outbox().Table()+` WHERE state IN (0, 2)`).Scan(&undelivered))
	require.Equal(t, undelivered, h.status("p").Backlog, "backlog in memory vs undelivered rows")
	require.Zero(t, h.status("p").Skipped)
	require.NotContains(t, logs.String(), "operator skipped")

	// The admin API: the stale page's post is refused with 409 and why.
	code, body := adminForm(t, h.admin.URL+"/partners/p/skip", url.Values{"event": {seen}}, nil)
	require.Equal(t, http.StatusConflict, code)
	require.Contains(t, body, "is now \""+y+"\"")
	code, body = adminForm(t, h.admin.URL+"/partners/p/skip", nil, nil)
	require.Equal(t, http.StatusBadRequest, code, "a skip without the head seen")
	require.Contains(t, body, "needs the form field event")
	require.Empty(t, skippedRows())
	// The page reloaded shows y, with it in its Skip form.
	resp, gerr := http.Get(h.admin.URL + "/")
	require.NoError(t, gerr)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(page), `name="event" value="`+y+`"`)
	code, _ = adminForm(t, h.admin.URL+"/partners/p/skip", url.Values{"event": {y}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, []string{y}, skippedRows())
	require.Contains(t, logs.String(), "event="+y, "the skipped event is the one logged")
	require.Equal(t, uint64(1), h.status("p").Skipped)
	require.Zero(t, h.status("p").Backlog)
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
