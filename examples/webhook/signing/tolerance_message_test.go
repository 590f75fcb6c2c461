package signing_test

import (
	"regexp"
	"testing"
	"time"

	"github.com/keysched/keysched/examples/webhook/signing"
	"github.com/stretchr/testify/require"
)

// TestToleranceRefusalStatesAnOffsetBeyondTheTolerance: a timestamp refused
// as too old or too new is said to be further from now than the tolerance.
// Found by attacking the code: with the receiver's clock at half a second
// (clocks have sub-second precision, timestamps have not), a timestamp 301 s
// ahead (300.5 s, refused) was reported "is 5m0s after now ..., tolerance
// 5m0s", truncated to the second, a reason that contradicts the refusal.
func TestToleranceRefusalStatesAnOffsetBeyondTheTolerance(t *testing.T) {
	now := time.Unix(testTS, 500_000_000)
	v, err := signing.NewVerifier([]string{testSecret}, clockAt(now))
	require.NoError(t, err)
	offset := regexp.MustCompile(`is (\S+) (before|after) now`)
	for _, c := range []struct {
		ts   int64
		want error
	}{
		{testTS + 301, signing.ErrTooNew}, // 300.5 s after now
		{testTS - 300, signing.ErrTooOld}, // 300.5 s before now
	} {
		err := v.Verify(headers(testID, c.ts, testSig), []byte(testBody))
		require.ErrorIs(t, err, c.want)
		m := offset.FindStringSubmatch(err.Error())
		require.NotNil(t, m, err.Error())
		d, perr := time.ParseDuration(m[1])
		require.NoError(t, perr)
		require.Greater(t, d, signing.DefaultTolerance, "the reason contradicts the refusal: %v", err)
	}
}
