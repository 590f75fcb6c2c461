package keysched

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A later Close whose context ends with a cause of the caller's
// (context.WithTimeoutCause) escalates the first Close with an error that
// matches both the context's error (context.DeadlineExceeded, as the
// CloseError's doc promises) and the cause. The cause alone was wrapped:
// errors.Is(err, context.DeadlineExceeded) was false for that caller.
func TestLaterCloseEscalationWrapsTheContextErrorAndItsCause(t *testing.T) {
	s, ctx, _, first := closeWaitingOnAParkedKey(t)
	errOperator := errors.New("operator gave up on the drain")
	short, cancel := context.WithTimeoutCause(ctx, time.Millisecond, errOperator)
	defer cancel()
	err := s.Close(short)
	require.ErrorIs(t, err, ErrAborted)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, errOperator)
	var ce *CloseError
	require.ErrorAs(t, err, &ce)
	require.ErrorIs(t, ce.Cause, context.DeadlineExceeded)
	require.ErrorIs(t, recvWithin(t, first, 10*time.Second, "the first Close, escalated"), context.DeadlineExceeded)
}
