package service

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
)

// A range replay that fails after it retried the partner's parked event,
// before it wrote the deliveries to send again, says so: the error (and the
// HTTP answer, which carries only the error) names the event retried and
// the events not sent again. It said "webhook: replay: <the database's
// error>", and the operator could not tell that the partner had resumed.
func TestReplayThatFailsHalfwaySaysWhatItDid(t *testing.T) {
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusNoContent, "" })
	h := newHarness(t, nil, func(c *Config) {
		c.Partners = map[string]string{"p": ep.srv.URL}
		c.Retry = keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	})
	from := time.Now().Add(-time.Second)
	e0 := h.postDelivered("p", 1)[0]
	ep.set(func(int, string) (int, string) { return http.StatusGone, "gone" })
	_, e1 := h.post("p", 1)
	require.Eventually(t, func() bool { return len(h.parked()) == 1 }, waitLong, 5*time.Millisecond)
	to := time.Now().Add(time.Second)
	// The replays' table gone between the retry of e1 and the write of
	// e0's new delivery.
	h.svc.beforeRequeue = func() {
		_, err := h.store.db.ExecContext(context.Background(), `ALTER TABLE `+h.store.replay+` RENAME TO gone`)
		require.NoError(t, err)
	}
	form := url.Values{"from": {from.UTC().Format(time.RFC3339Nano)}, "to": {to.UTC().Format(time.RFC3339Nano)}}
	code, body := adminForm(t, h.admin.URL+"/partners/p/replay", form, nil)
	require.Equal(t, http.StatusInternalServerError, code)
	require.Contains(t, body, "1 parked event retried ["+e1+"]")
	require.Contains(t, body, "1 event not sent again ["+e0+"]")
}
