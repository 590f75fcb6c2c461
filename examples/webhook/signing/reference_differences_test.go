package signing_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/examples/webhook/signing"
)

// TestVerifyDiffersFromTheReferenceLibraryAsDocumented holds the package
// doc's list of the requests the reference Go library accepts and Verify
// refuses: an ID containing '.', and a timestamp header not in Sign's plain
// digits signed over the plain number. Found by running both on the same
// requests (the package doc said they agree, with no exception).
func TestVerifyDiffersFromTheReferenceLibraryAsDocumented(t *testing.T) {
	s, err := signing.NewSecret()
	require.NoError(t, err)
	ref, err := standardwebhooks.NewWebhook(s.Encode())
	require.NoError(t, err)
	ver, err := signing.NewVerifier([]string{s.Encode()})
	require.NoError(t, err)
	body := []byte(`{"a":1}`)
	now := time.Now()
	plain := strconv.FormatInt(now.Unix(), 10)
	for _, c := range []struct {
		name, id, ts string
		want         error
	}{
		{"an ID with a dot", "msg.1", plain, signing.ErrInvalidHeader},
		{"a timestamp with a plus sign", "msg_1", "+" + plain, signing.ErrInvalidHeader},
		{"a timestamp with a leading zero", "msg_1", "0" + plain, signing.ErrNoMatch},
	} {
		t.Run(c.name, func(t *testing.T) {
			sig, err := ref.Sign(c.id, now, body) // over the plain number
			require.NoError(t, err)
			h := http.Header{}
			h.Set(signing.HeaderID, c.id)
			h.Set(signing.HeaderTimestamp, c.ts)
			h.Set(signing.HeaderSignature, sig)
			require.NoError(t, ref.Verify(body, h), "the reference library accepts it")
			require.ErrorIs(t, ver.Verify(h, body), c.want)
		})
	}
}
