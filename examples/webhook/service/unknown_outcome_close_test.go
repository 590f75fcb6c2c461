package service

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/examples/webhook/sim"
)

// Close cancels the read of an unknown outcome's follow-up in progress (a
// database that hangs): the read sees context.Canceled, and Close does not
// wait out its 5 s bound. Its context was context.Background's, which Close
// could not end: Close waited until the read's own deadline.
func TestCloseCancelsTheReadOfAnUnknownOutcome(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {}}, nil)
	started := make(chan struct{})
	ended := make(chan error, 1)
	h.svc.watchUnknown(func(ctx context.Context) bool {
		close(started)
		<-ctx.Done() // a read of a database that hangs
		ended <- ctx.Err()
		return true
	})
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := h.svc.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		require.NoError(t, err)
	}
	require.ErrorIs(t, <-ended, context.Canceled, "the read was cancelled by Close, not ended by its own deadline")
}
