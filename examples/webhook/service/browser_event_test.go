package service

import (
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/examples/webhook/sim"
)

// In a real headless Chromium, an operator searches an event by its ID from
// the operator page, sees its state and attempts, presses Replay: the event
// arrives again (same Webhook-Id), the replay is logged, and the reloaded
// page shows the replay and its attempt; the partner's page lists the event.
func TestEventLookupAndReplayInBrowser(t *testing.T) {
	ctx, stop := newBrowser(t, "the event pages")
	defer stop()
	logs := &syncBuffer{}
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusOK, `{"received":true}` })
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) {
		c.Partners = map[string]string{"p": ep.srv.URL}
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	posted := h.postDelivered("p", 2)
	e0, e1 := posted[0], posted[1]
	text := func(sel string) string { t.Helper(); return cssText(t, ctx, sel) }
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll(`+"`"+sel+"`"+`).length`))
		require.NoError(t, err, sel)
		return n
	}
	// The first Run starts the browser: no timeout on its context.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(h.admin.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS("#search-id")),
		chromedp.SendKeys(chromedp.CSS("#search-id"), e0),
		chromedp.Click(chromedp.CSS("#search-go")),
		chromedp.WaitVisible(chromedp.CSS("#event-id")),
	))
	require.Equal(t, e0, text("#event-id"))
	require.Equal(t, StateDelivered, text("#state"))
	require.Equal(t, 1, count("#attempts tr.attempt"))
	require.Contains(t, text("#attempts"), `{"received":true}`)

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS("#replay")),
		chromedp.WaitVisible(chromedp.CSS("#flash")),
	))
	require.Equal(t, "replay: 1 sent again (queued behind the partner's undelivered events)", text("#flash"))
	require.Eventually(t, func() bool { ids, _ := ep.received(); return len(ids) == 3 }, waitLong, 5*time.Millisecond)
	ids, _ := ep.received()
	require.Equal(t, []string{e0, e1, e0}, ids)
	require.Contains(t, logs.String(), `msg="operator replayed an event" event=`+e0)

	require.Eventually(t, func() bool {
		ev := h.event(e0)
		return len(ev.Attempts) == 2 && len(ev.Replays) == 1 && ev.Replays[0].State == StateDelivered
	}, waitLong, 5*time.Millisecond)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(h.admin.URL+"/ui/events/"+e0),
		chromedp.WaitVisible(chromedp.CSS("#replays")),
	))
	require.Equal(t, 2, count("#attempts tr.attempt"))
	require.Contains(t, text("#replays"), StateDelivered)

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(h.admin.URL+"/ui/partners/p"),
		chromedp.WaitVisible(chromedp.CSS("#latest")),
	))
	require.Equal(t, StateDelivered, text(`#latest tr[data-event="`+e0+`"] td.state`))
}
