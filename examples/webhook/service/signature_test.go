package service

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/keysched/keysched/examples/webhook/signing"
	"github.com/stretchr/testify/require"
)

// Every request carries the Standard Webhooks headers, signed with every
// secret of its partner (a rotation: a receiver holding the new or the old
// one accepts, one holding neither refuses), and its webhook-timestamp is the
// attempt's time: an event accepted an hour ago and delivered now passes a
// receiver's 5-minute tolerance (signed with the intake time, it would be
// refused as a replay).
func TestDeliveriesAreSignedWithEverySecretAtAttemptTime(t *testing.T) {
	var (
		mu   sync.Mutex
		hdr  http.Header
		body []byte
	)
	ep := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		hdr, body = r.Header.Clone(), b
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer ep.Close()
	newS, err := signing.NewSecret()
	require.NoError(t, err)
	oldS, err := signing.NewSecret()
	require.NoError(t, err)
	d := testDeliverer(t, nil, map[string]string{"p": ep.URL}, func(c *DelivererConfig) {
		c.Secrets["p"] = []signing.Secret{newS, oldS}
	})
	ev := Delivery{Partner: "p", ID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", Received: time.Now().Add(-time.Hour), Body: []byte(`{"id":"x","data":{}}`)}
	require.NoError(t, d.Deliver(t.Context(), ev))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, ev.ID, hdr.Get("webhook-id"))
	for name, secrets := range map[string][]string{"new": {newS.Encode()}, "old": {oldS.Encode()}} {
		v, err := signing.NewVerifier(secrets)
		require.NoError(t, err)
		require.NoError(t, v.Verify(hdr, body), "a receiver holding the %s secret", name)
	}
	stranger, err := signing.NewSecret()
	require.NoError(t, err)
	v, err := signing.NewVerifier([]string{stranger.Encode()})
	require.NoError(t, err)
	require.ErrorIs(t, v.Verify(hdr, body), signing.ErrNoMatch)
}

// A partner without a secret, a malformed secret, or a secret for no partner
// is refused at start, naming the partner and never the secret.
func TestConfigRefusesMissingOrBadSecrets(t *testing.T) {
	st, err := OpenSQLite(t.Context(), t.TempDir()+"/w.db")
	require.NoError(t, err)
	defer st.Close()
	good, err := signing.NewSecret()
	require.NoError(t, err)
	for name, secrets := range map[string]map[string][]string{
		"none":         nil,
		"empty list":   {"acme": {}},
		"not base64":   {"acme": {"whsec_not!base64"}},
		"too short":    {"acme": {"whsec_c2hvcnQ="}},
		"for nobody":   {"acme": {good.Encode()}, "globex": {good.Encode()}},
		"one bad of 2": {"acme": {good.Encode(), "whsec_"}},
	} {
		_, err := New(t.Context(), Config{Partners: map[string]string{"acme": "http://127.0.0.1:1/"}, Secrets: secrets, Store: st})
		require.ErrorIs(t, err, ErrInvalidConfig, name)
		require.NotContains(t, err.Error(), good.Encode()[6:], name)
	}
}

func testSecret(t *testing.T) signing.Secret {
	t.Helper()
	s, err := signing.NewSecret()
	require.NoError(t, err)
	return s
}
