package sim

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/keysched/keysched/examples/webhook/signing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCheckOrder(t *testing.T) {
	acc := []string{"a", "b", "c"}
	for _, c := range []struct {
		got  []string
		dups int
		err  string
	}{
		{[]string{"a", "b", "c"}, 0, ""},
		{[]string{"a", "a", "b", "a", "c", "c"}, 3, ""},     // redeliveries anywhere after the first arrival
		{[]string{"a", "b", "c", "b", "c"}, 2, ""},          // a replay after a crash
		{[]string{"b", "a", "c"}, 0, "out of order"},        // b before a
		{[]string{"a", "c"}, 0, "out of order"},             // b lost, c arrived
		{[]string{"a", "b"}, 0, "never delivered"},          // c missing
		{[]string{"a", "x", "b", "c"}, 0, "never accepted"}, // unknown ID
	} {
		dups, err := CheckOrder(acc, c.got)
		if c.err == "" {
			require.NoError(t, err, "%v", c.got)
			require.Equal(t, c.dups, dups, "%v", c.got)
			continue
		}
		var oe *OrderError
		require.True(t, errors.As(err, &oe), "%v: %v", c.got, err)
		require.Contains(t, err.Error(), c.err)
	}
}

func TestEndpointBehaviours(t *testing.T) {
	rec := NewRecorder()
	e, err := NewEndpoint(rec, Behavior{Down: true})
	require.NoError(t, err)
	defer e.Close()
	secret, err := signing.NewSecret()
	require.NoError(t, err)
	require.NoError(t, rec.AddSecrets("p", secret.Encode()))
	post := func(id string) int {
		req, _ := http.NewRequest(http.MethodPost, e.URL, strings.NewReader(`{}`))
		if id != "" {
			signing.SetHeaders(req.Header, id, time.Now(), []byte(`{}`), secret)
			req.Header.Set(headerPartner, "p")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, 503, post("1"))
	e.Set(Behavior{})
	require.Equal(t, 400, post(""), "a delivery without its ID is refused")
	require.Equal(t, 204, post("1"))
	e.Set(Behavior{FailRate: 1})
	require.Equal(t, 500, post("2"))
	require.Equal(t, []string{"1"}, rec.IDs("p"))
	acc, all := rec.Total()
	require.Equal(t, 1, acc)
	require.Equal(t, 4, all)
	// A hanging request is released when Hang is cleared.
	e.Set(Behavior{Hang: true})
	done := make(chan int)
	go func() { done <- post("3") }()
	require.Eventually(t, func() bool { _, n := rec.Total(); return n == 5 }, 10e9, 1e6)
	e.Set(Behavior{})
	require.Equal(t, 503, <-done)
	require.Equal(t, 204, post("3"))
	e.Set(Behavior{Throttle: 3})
	require.Equal(t, 429, post("4"))
	e.Set(Behavior{})
	bad, _ := rec.BadSignatures()
	require.Zero(t, bad)
}

// An endpoint verifies the signature before anything else: a wrong secret,
// a changed body, or a partner it holds no secret for is a 401, counted.
func TestEndpointRefusesBadSignatures(t *testing.T) {
	rec := NewRecorder()
	e, err := NewEndpoint(rec, Behavior{})
	require.NoError(t, err)
	defer e.Close()
	good, err := rec.NewSecret("p")
	require.NoError(t, err)
	sec, err := signing.ParseSecret(good)
	require.NoError(t, err)
	other, err := signing.NewSecret()
	require.NoError(t, err)
	post := func(partner string, s signing.Secret, signed, sent string) int {
		req, _ := http.NewRequest(http.MethodPost, e.URL, strings.NewReader(sent))
		signing.SetHeaders(req.Header, "evt-1", time.Now(), []byte(signed), s)
		req.Header.Set(headerPartner, partner)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, 401, post("p", other, `{}`, `{}`))
	require.Equal(t, 401, post("p", sec, `{}`, `{ }`))
	require.Equal(t, 401, post("q", sec, `{}`, `{}`))
	require.Equal(t, 204, post("p", sec, `{}`, `{}`))
	n, last := rec.BadSignatures()
	require.Equal(t, 3, n)
	require.Contains(t, last, "no signing secret for partner q")
	require.Equal(t, []string{"evt-1"}, rec.IDs("p"))
}
