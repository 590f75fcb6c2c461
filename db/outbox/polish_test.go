package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A sink that panics is a failed call like one that returns an error:
// SinkErrors counts every panicking call, the row dies after MaxAttempts with
// the panic as its error.
func TestSinkPanicCountsAsSinkError(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, 1, 1)
		died := make(chan struct{})
		r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
			panic("sink bug")
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond),
			outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}),
			outbox.WithOnDead(func(outbox.DeadEvent) { close(died) }))
		require.NoError(t, err)
		stop := runRelay(t, r)
		select {
		case <-died:
		case <-time.After(30 * time.Second):
			t.Fatal("the panicking row was not marked dead")
		}
		stop()
		st := r.Stats()
		require.EqualValues(t, 2, st.SinkErrors, "each panicking call counts")
		require.EqualValues(t, 1, st.Dead)
		require.Zero(t, st.Published)
		dead, err := ob.Dead(ctx, 10)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		require.Equal(t, 2, dead[0].Attempts)
		require.Contains(t, dead[0].Err, "sink bug")
	})
}

// Close is bounded by its context even when a sink call ignores its own:
// it returns (within keysched.CloseGrace) an error wrapping ctx's that counts
// the call still running; the call finishes in the background, its success
// is marked (the relay kept the lease), and Run returns after it.
func TestCloseBoundedWhenSinkIgnoresContext(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, 1, 1)
		started, release := make(chan struct{}), make(chan struct{})
		r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
			close(started)
			<-release // ignores ctx
			return nil
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond))
		require.NoError(t, err)
		errc := make(chan error, 1)
		go func() { errc <- r.Run(context.Background()) }()
		<-started
		cctx, cancel := context.WithCancel(context.Background())
		cancel() // Close gives up at once: the bound is CloseGrace
		closed := make(chan error, 1)
		go func() { closed <- r.Close(cctx) }()
		var cerr error
		select {
		case cerr = <-closed:
		case <-time.After(30 * time.Second):
			close(release)
			<-closed
			t.Fatal("Close waited for a sink call that ignores its context")
		}
		require.ErrorIs(t, cerr, context.Canceled)
		require.ErrorContains(t, cerr, "1 sink calls still running")
		select {
		case err := <-errc:
			t.Fatalf("Run returned (%v) while its sink call still ran", err)
		default:
		}
		close(release)
		require.NoError(t, <-errc)
		st := r.Stats()
		require.EqualValues(t, 1, st.Published)
		require.EqualValues(t, 1, st.Marked, "the call that succeeded late is marked sent")
		require.Empty(t, counts(t, ob), "nothing left pending")
	})
}
