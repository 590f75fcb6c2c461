package keysched

import (
	"context"
	"errors"
	"runtime"
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
	s, err := New[int](WithLogger(quiet), WithFailurePolicy(Park))
	require.NoError(t, err)
	ctx := watchdog(t)
	_, err = s.Submit(ctx, 1, func(context.Context) error { return errors.New("down") })
	require.NoError(t, err)
	for len(s.Parked()) == 0 {
		require.NoError(t, ctx.Err())
		runtime.Gosched()
	}
	first := make(chan error, 1)
	go func() { first <- s.Close(context.Background()) }()
	for !s.pending.closed() {
		runtime.Gosched()
	}
	errOperator := errors.New("operator gave up on the drain")
	short, cancel := context.WithTimeoutCause(ctx, time.Millisecond, errOperator)
	defer cancel()
	err = s.Close(short)
	require.ErrorIs(t, err, ErrAborted)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, errOperator)
	var ce *CloseError
	require.ErrorAs(t, err, &ce)
	require.ErrorIs(t, ce.Cause, context.DeadlineExceeded)
	require.ErrorIs(t, <-first, context.DeadlineExceeded)
}
