package signing_test

import (
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/keysched/keysched/examples/webhook/signing"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/require"
)

// The specification's published test vectors, from its repository
// github.com/standard-webhooks/standard-webhooks (commit b2fa7b8):
//
//   - libraries/go/webhook_test.go TestWebhookSign (the same vector is in
//     libraries/python/tests/test_webhooks.py test_sign_function,
//     libraries/javascript/src/webhook.test.ts, libraries/php/tests/WebhookTest.php,
//     libraries/ruby/spec/webhook_spec.rb, libraries/java/.../TestScenario.java
//     and libraries/csharp/.../WebhookTest.cs);
//   - libraries/rust/src/lib.rs test_sign, and test_no_verify's signature,
//     which must not verify.
var vectors = []struct {
	name, secret, id string
	ts               int64
	body, want       string
}{
	{"go/python/js/php/ruby/java/csharp", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330,
		`{"test": 2432232314}`, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="},
	{"rust", "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD", "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk", 1649367553,
		`{"email":"test@example.com","username":"test_user"}`, "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="},
}

func headers(id string, ts int64, sig string) http.Header {
	h := http.Header{}
	h.Set(signing.HeaderID, id)
	h.Set(signing.HeaderTimestamp, strconv.FormatInt(ts, 10))
	h.Set(signing.HeaderSignature, sig)
	return h
}

func TestSignMatchesPublishedVectors(t *testing.T) {
	for _, v := range vectors {
		t.Run(v.name, func(t *testing.T) {
			s, err := signing.ParseSecret(v.secret)
			require.NoError(t, err)
			require.Equal(t, v.want, signing.Sign(v.id, time.Unix(v.ts, 0), []byte(v.body), s))
		})
	}
}

func TestVerifyAcceptsPublishedVectors(t *testing.T) {
	for _, v := range vectors {
		t.Run(v.name, func(t *testing.T) {
			at := func() time.Time { return time.Unix(v.ts, 0).Add(time.Minute) }
			ver, err := signing.NewVerifier([]string{v.secret}, signing.WithClock(at))
			require.NoError(t, err)
			require.NoError(t, ver.Verify(headers(v.id, v.ts, v.want), []byte(v.body)))
			// One byte changed anywhere fails.
			require.ErrorIs(t, ver.Verify(headers(v.id, v.ts, v.want), []byte(v.body+" ")), signing.ErrNoMatch)
			require.ErrorIs(t, ver.Verify(headers(v.id+"x", v.ts, v.want), []byte(v.body)), signing.ErrNoMatch)
			require.ErrorIs(t, ver.Verify(headers(v.id, v.ts+1, v.want), []byte(v.body)), signing.ErrNoMatch)
		})
	}
	// libraries/rust/src/lib.rs test_no_verify: a wrong signature.
	ver, err := signing.NewVerifier([]string{"whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"}, signing.WithClock(func() time.Time { return time.Unix(1649367553, 0) }))
	require.NoError(t, err)
	err = ver.Verify(headers("msg_27UH4WbU6Z5A5EzD8u03UvzRbpk", 1649367553, "v1,R3PTzyfHASBKHH98a7yexTwaJ4yNIcGhFQc1yuN+BPU="),
		[]byte(`{"email":"test@example.com","username":"test_user"}`))
	require.ErrorIs(t, err, signing.ErrNoMatch)
}

// The specification's reference Go library
// (github.com/standard-webhooks/standard-webhooks/libraries/go, v0.0.1)
// verifies what Sign produces, and Verify accepts what it signs. It is not
// used as the verifier itself: it takes one secret only (no rotation on the
// receiver's side), its 5-minute tolerance is a package variable, and it
// cannot be given a clock.
func TestAgreesWithReferenceLibrary(t *testing.T) {
	s, err := signing.NewSecret()
	require.NoError(t, err)
	ref, err := standardwebhooks.NewWebhook(s.Encode())
	require.NoError(t, err)
	ver, err := signing.NewVerifier([]string{s.Encode()})
	require.NoError(t, err)
	body := []byte(`{"id":"0193","partner":"acme","type":"order.created","data":{"n":1}}`)
	now := time.Now()

	h := http.Header{}
	signing.SetHeaders(h, "0193a1b2-c3d4", now, body, s)
	require.NoError(t, ref.Verify(body, h), "the reference library refuses our signature")

	sig, err := ref.Sign("msg_p5jXN8AQM9LWM0D4loKWxJek", now, body)
	require.NoError(t, err)
	require.NoError(t, ver.Verify(headers("msg_p5jXN8AQM9LWM0D4loKWxJek", now.Unix(), sig), body))

	// A rotation: two signatures in one header, the reference library
	// holding either secret accepts.
	old, err := signing.NewSecret()
	require.NoError(t, err)
	refOld, err := standardwebhooks.NewWebhook(old.Encode())
	require.NoError(t, err)
	h = http.Header{}
	signing.SetHeaders(h, "0193a1b2-c3d4", now, body, s, old)
	require.NoError(t, ref.Verify(body, h))
	require.NoError(t, refOld.Verify(body, h))
	stranger, err := signing.NewSecret()
	require.NoError(t, err)
	refStranger, err := standardwebhooks.NewWebhook(stranger.Encode())
	require.NoError(t, err)
	require.True(t, errors.Is(refStranger.Verify(body, h), standardwebhooks.ErrNoMatchingSignature))
}
