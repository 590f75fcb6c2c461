package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// An idle relay whose LISTEN connection is terminated (pg_terminate_backend)
// still publishes a write committed while it listens to nothing, within a
// poll interval; once it listens again it is idle with a live row, and a
// write wakes it by notification again.
func TestIdleRelayWhoseListenerIsTerminatedStillPublishes(t *testing.T) {
	db := dbtest.Postgres(t)
	ctx := context.Background()
	ob := newOutbox(t, db)
	delivered := make(chan string, 10)
	const poll = time.Second
	r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		delivered <- string(e.Payload)
		return nil
	}, outbox.WithLogger(quiet), outbox.WithPollInterval(poll))
	require.NoError(t, err)
	runRelay(t, r)
	waitUntil(t, "relay idle and listening", func() bool { return outbox.Idle(r) && r.Stats().Listening })
	require.Equal(t, 1, idleRows(t, db, ob, r))

	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = $1`,
		`LISTEN "`+ob.Table()+`"`).Scan(&n))
	require.Equal(t, 1, n, "listener backends terminated")
	committed := time.Now()
	commitEvent(t, ob, "k", "while the listener is down")
	select {
	case p := <-delivered:
		require.Equal(t, "while the listener is down", p)
	case <-time.After(30 * time.Second):
		t.Fatal("a write committed while the listener was down was never published")
	}
	require.Less(t, time.Since(committed), poll+10*time.Second)

	waitUntil(t, "listening again, idle", func() bool { return r.Stats().Listening && outbox.Idle(r) && idleRows(t, db, ob, r) == 1 })
	before := r.Stats().Notifications
	commitEvent(t, ob, "k", "after the listener is back")
	select {
	case p := <-delivered:
		require.Equal(t, "after the listener is back", p)
	case <-time.After(30 * time.Second):
		t.Fatal("never published")
	}
	require.Greater(t, r.Stats().Notifications, before, "the write notified the relay listening again")
}
