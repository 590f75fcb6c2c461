package service

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
)

const testAdminToken = "s3cret-admin-token-0123456789"

// With an AdminToken, the operator page, its actions and /metrics answer
// only a request carrying the token (Bearer, or Basic's password); a
// missing token, a wrong one, a wrong scheme get the same 401 (same body,
// same challenges), and an action refused so changes nothing.
func TestAdminRequiresTokenAndDoesNotSayWhy(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {Down: true}}, func(c *Config) {
		c.AdminToken = testAdminToken
		c.Retry = keysched.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
		c.MetricsHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "metrics") })
	})
	h.post("p", 0)
	require.Eventually(t, func() bool { return len(h.parked()) == 1 }, waitLong, 5*time.Millisecond)

	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path string, auth func(*http.Request)) (int, string, []string) {
		req, err := http.NewRequest(method, h.admin.URL+path, nil)
		require.NoError(t, err)
		if auth != nil {
			auth(req)
		}
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header.Values("WWW-Authenticate")
	}
	bearer := func(tok string) func(*http.Request) {
		return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) }
	}
	refusals := map[string]func(*http.Request){
		"missing":        nil,
		"wrong":          bearer("s3cret-admin-token-0123456788"),
		"prefix":         bearer(testAdminToken[:20]),
		"longer":         bearer(testAdminToken + "x"),
		"empty bearer":   func(r *http.Request) { r.Header.Set("Authorization", "Bearer ") },
		"other scheme":   func(r *http.Request) { r.Header.Set("Authorization", "Token "+testAdminToken) },
		"wrong password": func(r *http.Request) { r.SetBasicAuth("ops", "nope") },
		"token as user":  func(r *http.Request) { r.SetBasicAuth(testAdminToken, "") },
	}
	var first string
	var firstChallenges []string
	for name, auth := range refusals {
		for _, target := range []struct{ method, path string }{
			{http.MethodGet, "/"}, {http.MethodGet, "/metrics"},
			{http.MethodPost, "/partners/p/skip"}, {http.MethodPost, "/partners/p/resume"},
		} {
			code, body, challenges := do(target.method, target.path, auth)
			require.Equal(t, http.StatusUnauthorized, code, "%s %s %s", name, target.method, target.path)
			if first == "" {
				first, firstChallenges = body, challenges
			}
			require.Equal(t, first, body, "the 401 must not say which: %s", name)
			require.Equal(t, firstChallenges, challenges)
		}
	}
	require.Len(t, firstChallenges, 2, "a Bearer and a Basic challenge (browsers ask for the token)")
	require.Equal(t, []string{"p"}, h.parked(), "a refused action changed something")

	code, body, _ := do(http.MethodGet, "/", bearer(testAdminToken))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "p")
	code, body, _ = do(http.MethodGet, "/metrics", func(r *http.Request) { r.SetBasicAuth("anyone", testAdminToken) })
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "metrics", body)
	code, _, _ = do(http.MethodPost, "/partners/p/skip?event="+url.QueryEscape(h.head("p")), bearer(testAdminToken))
	require.Equal(t, http.StatusSeeOther, code)
	require.Empty(t, h.parked())
}

// A token too short to be a secret is a configuration error; none at all is
// allowed (the program decides when that is acceptable: loopback only).
func TestAdminTokenTooShortIsRefused(t *testing.T) {
	st, err := OpenSQLite(t.Context(), t.TempDir()+"/w.db")
	require.NoError(t, err)
	defer st.Close()
	_, err = New(t.Context(), Config{
		Partners: map[string]string{"acme": "http://127.0.0.1:1/"}, Secrets: map[string][]string{"acme": {testSecret(t).Encode()}},
		Store: st, AdminToken: strings.Repeat("x", MinAdminTokenBytes-1),
	})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.NotContains(t, err.Error(), "xxxxxxxx", "the error must not echo the token")
}
