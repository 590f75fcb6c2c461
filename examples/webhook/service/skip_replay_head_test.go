package service

import (
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
)

// A replay of a delivered event E that parks its partner is the head under
// its own delivery ID R (the page shows "E (replay R)"). Skip with E is
// refused (409, nothing skipped) as before, but the answer now says R is a
// replay of E and to send event=R (it said only "its head is now R, not
// E"); GET /events/R says whose replay R is (it said only "unknown
// event"). Skip with R gives the replay up. Skip does not take E for its
// replay: see Service.Skip.
func TestSkipOfAReplayedEventNamesTheReplayToSend(t *testing.T) {
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusNoContent, "" })
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) {
		c.Partners = map[string]string{"p": ep.srv.URL}
		c.Retry = keysched.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	})
	e := h.postDelivered("p", 1)[0]
	ep.set(func(int, string) (int, string) { return http.StatusServiceUnavailable, "down" })
	res, err := h.svc.Replay(t.Context(), e)
	require.NoError(t, err)
	require.Equal(t, []string{e}, res.Requeued)
	require.Eventually(t, func() bool { return h.head("p") != "" }, waitLong, 5*time.Millisecond)
	st := h.status("p")
	r := st.Head
	require.Equal(t, e, st.HeadEvent)
	require.NotEqual(t, e, r)

	code, body := adminForm(t, h.admin.URL+"/partners/p/skip", url.Values{"event": {e}}, nil)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, `its head is "`+r+`", a replay of event "`+e+`"`)
	require.Contains(t, body, "send event="+r)
	require.Equal(t, r, h.head("p"), "nothing skipped")

	resp, err := http.Get(h.admin.URL + "/events/" + r)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.Contains(t, string(b), `the delivery ID of a replay of event \"`+e+`\"`)

	code, body = adminForm(t, h.admin.URL+"/partners/p/skip", url.Values{"event": {r}}, nil)
	require.Equal(t, http.StatusSeeOther, code, body)
	require.Eventually(t, func() bool {
		ev := h.event(e)
		return len(ev.Replays) == 1 && ev.Replays[0].State == StateSkipped
	}, waitLong, 5*time.Millisecond)
}
