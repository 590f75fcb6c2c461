package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A Relay runs once. A second Run while the first runs, or after it
// returned, matches ErrClosed (as documented) but says what happened: before,
// it read "outbox: relay closed" while the relay was running. Run after
// Close, with no Run before, is plain ErrClosed.
func TestSecondRunSaysRunWasCalled(t *testing.T) {
	ctx := context.Background()
	ob := newOutbox(t, dbtest.SQLite(t))
	writeEvents(t, ob, 1, 1, 1)
	delivered := make(chan struct{}, 1)
	r, err := ob.NewRelay(func(context.Context, outbox.Event) error {
		select {
		case delivered <- struct{}{}:
		default:
		}
		return nil
	}, outbox.WithLogger(quiet))
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- r.Run(rctx) }()
	<-delivered // the first Run is running

	err = r.Run(ctx)
	require.ErrorIs(t, err, outbox.ErrClosed)
	require.Contains(t, err.Error(), "Run is running")
	require.NotContains(t, err.Error(), "relay closed")

	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	err = r.Run(ctx)
	require.ErrorIs(t, err, outbox.ErrClosed)
	require.Contains(t, err.Error(), "Run returned")
	require.NoError(t, r.Close(ctx))

	unrun, err := ob.NewRelay(func(context.Context, outbox.Event) error { return nil }, outbox.WithLogger(quiet))
	require.NoError(t, err)
	require.NoError(t, unrun.Close(ctx))
	require.Equal(t, outbox.ErrClosed, unrun.Run(ctx), "Run after Close, never run")
}
