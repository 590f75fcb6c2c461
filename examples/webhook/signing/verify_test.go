package signing_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/keysched/keysched/examples/webhook/signing"
	"github.com/stretchr/testify/require"
)

const (
	testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	testID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	testTS     = 1614265330
	testBody   = `{"test": 2432232314}`
	testSig    = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func clockAt(t time.Time) signing.Option { return signing.WithClock(func() time.Time { return t }) }

func TestVerifyRefusesTimestampOutsideTolerance(t *testing.T) {
	at := time.Unix(testTS, 0)
	for _, c := range []struct {
		name string
		now  time.Time
		tol  time.Duration
		want error
	}{
		{"exactly the default tolerance late", at.Add(signing.DefaultTolerance), 0, nil},
		{"a second past the default tolerance", at.Add(signing.DefaultTolerance + time.Second), 0, signing.ErrTooOld},
		{"a second early beyond the default tolerance", at.Add(-signing.DefaultTolerance - time.Second), 0, signing.ErrTooNew},
		{"within a custom tolerance", at.Add(59 * time.Minute), time.Hour, nil},
		{"beyond a custom tolerance", at.Add(11 * time.Second), 10 * time.Second, signing.ErrTooOld},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := []signing.Option{clockAt(c.now)}
			if c.tol != 0 {
				opts = append(opts, signing.WithTolerance(c.tol))
			}
			v, err := signing.NewVerifier([]string{testSecret}, opts...)
			require.NoError(t, err)
			err = v.Verify(headers(testID, testTS, testSig), []byte(testBody))
			if c.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, c.want)
			require.Contains(t, err.Error(), "tolerance", "the reason says why")
		})
	}
}

func TestVerifyAcceptsAnyOfSeveralSecrets(t *testing.T) {
	other, err := signing.NewSecret()
	require.NoError(t, err)
	now := clockAt(time.Unix(testTS, 0))
	// The receiver rotates: it holds the new and the old secret.
	v, err := signing.NewVerifier([]string{other.Encode(), testSecret}, now)
	require.NoError(t, err)
	require.NoError(t, v.Verify(headers(testID, testTS, testSig), []byte(testBody)))
	// The sender rotates: the header carries a signature by a secret the
	// receiver does not hold, an unknown scheme, garbage, then the good one.
	v, err = signing.NewVerifier([]string{testSecret}, now)
	require.NoError(t, err)
	s, _ := signing.ParseSecret(testSecret)
	multi := signing.Sign(testID, time.Unix(testTS, 0), []byte(testBody), other, s)
	require.NoError(t, v.Verify(headers(testID, testTS, "v1a,AAAA v1,!!notbase64 "+multi), []byte(testBody)))
	// Only the other secret's signature: no match.
	require.ErrorIs(t, v.Verify(headers(testID, testTS, signing.Sign(testID, time.Unix(testTS, 0), []byte(testBody), other)), []byte(testBody)), signing.ErrNoMatch)
}

func TestVerifyNamesWhatIsMissingOrInvalid(t *testing.T) {
	v, err := signing.NewVerifier([]string{testSecret}, clockAt(time.Unix(testTS, 0)))
	require.NoError(t, err)
	for _, c := range []struct {
		name string
		mod  func(http.Header)
		want error
		says string
	}{
		{"no id", func(h http.Header) { h.Del(signing.HeaderID) }, signing.ErrMissingHeader, "webhook-id"},
		{"no timestamp", func(h http.Header) { h.Del(signing.HeaderTimestamp) }, signing.ErrMissingHeader, "webhook-timestamp"},
		{"no signature", func(h http.Header) { h.Del(signing.HeaderSignature) }, signing.ErrMissingHeader, "webhook-signature"},
		{"timestamp with a sign", func(h http.Header) { h.Set(signing.HeaderTimestamp, "+1614265330") }, signing.ErrInvalidHeader, "digits"},
		{"timestamp in milliseconds beyond range", func(h http.Header) { h.Set(signing.HeaderTimestamp, "99999999999999999999") }, signing.ErrInvalidHeader, "digits"},
		{"id with a dot", func(h http.Header) { h.Set(signing.HeaderID, "msg.1") }, signing.ErrInvalidHeader, "'.'"},
		{"empty v1 signature", func(h http.Header) { h.Set(signing.HeaderSignature, "v1,") }, signing.ErrNoMatch, "1 v1 signatures"},
		{"only another scheme", func(h http.Header) { h.Set(signing.HeaderSignature, "v1a,"+testSig[3:]) }, signing.ErrNoMatch, "no v1 signature"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := headers(testID, testTS, testSig)
			c.mod(h)
			err := v.Verify(h, []byte(testBody))
			require.ErrorIs(t, err, c.want)
			require.Contains(t, err.Error(), c.says)
		})
	}
}

func TestParseSecretRefusesBadSecrets(t *testing.T) {
	for _, s := range []string{"", "whsec_", "whsec_!!!!", "whsec_" + strings.Repeat("A", 28), "whsec_" + strings.Repeat("A", 88)} {
		_, err := signing.ParseSecret(s)
		require.ErrorIs(t, err, signing.ErrInvalidSecret, "%q", s)
		if len(s) > 10 {
			require.NotContains(t, err.Error(), s[6:], "the error must not echo the secret")
		}
	}
	_, err := signing.NewVerifier(nil)
	require.ErrorIs(t, err, signing.ErrInvalidSecret)
	_, err = signing.NewVerifier([]string{testSecret}, signing.WithTolerance(0))
	require.Error(t, err)
	// Without the prefix, as the specification's libraries accept.
	s, err := signing.ParseSecret(strings.TrimPrefix(testSecret, "whsec_"))
	require.NoError(t, err)
	require.Equal(t, testSecret, s.Encode())
	require.NotContains(t, s.String(), "MfKQ", "String redacts")
}

func TestMiddlewareRefusesUnsignedAndPassesSigned(t *testing.T) {
	sec, err := signing.NewSecret()
	require.NoError(t, err)
	v, err := signing.NewVerifier([]string{sec.Encode()}, signing.WithMaxBody(64))
	require.NoError(t, err)
	var got []byte
	srv := httptest.NewServer(v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusNoContent)
	})))
	defer srv.Close()
	post := func(body string, sign bool) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		if sign {
			signing.SetHeaders(req.Header, "evt-1", time.Now(), []byte(body), sec)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusNoContent, post(`{"a":1}`, true))
	require.Equal(t, []byte(`{"a":1}`), got, "the handler reads the body as sent")
	require.Equal(t, http.StatusUnauthorized, post(`{"a":1}`, false))
	require.Equal(t, http.StatusRequestEntityTooLarge, post(string(bytes.Repeat([]byte("x"), 65)), true))
}
