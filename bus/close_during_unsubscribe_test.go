package bus

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Close whose context ends while an Unsubscribe (with a longer context)
// still closes a subscriber names that subscriber and says why, wrapping
// the context's error (it returned a bare "bus: close: context deadline
// exceeded"); so does a second Unsubscribe. The first Unsubscribe still
// returns nil once its handler is done.
func TestCloseWhileAnUnsubscribeClosesTheSubscriberNamesIt(t *testing.T) {
	ctx := guardCtx(t)
	b, err := New[int](WithWorkers(2), WithLogger(quiet))
	require.NoError(t, err)
	released, release := gate(t)
	started := make(chan struct{}, 1)
	sub, err := Subscribe(b, "slow", func(context.Context, Envelope[int], tick) error {
		started <- struct{}{}
		<-released
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, b.Publish(ctx, 1, tick{1}))
	recv(t, started, "the handler")
	unsubscribed := make(chan error, 1)
	go func() { unsubscribed <- sub.Unsubscribe(ctx) }()
	require.Eventually(t, func() bool { return len(b.Subscriptions()) == 0 }, 10*time.Second, time.Millisecond)

	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	err = sub.Unsubscribe(short)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, `"slow"`)
	err = b.Close(short)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, `subscriber "slow"`)
	require.ErrorContains(t, err, "still closing it")

	release()
	require.NoError(t, <-unsubscribed)
}
