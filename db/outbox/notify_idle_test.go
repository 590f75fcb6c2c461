package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// The trigger, and Write's statement under WithNotifyFromWrite, notify only
// while a relay is idle (a live row in the idle table): a write with no idle
// relay, or with an expired row, notifies nobody, so its commit does not
// take PostgreSQL's server-wide notify lock; every row is written.
func TestWritersNotifyOnlyWhileARelayIsIdle(t *testing.T) {
	for _, c := range []struct {
		name string
		make func(*testing.T, *sql.DB) *outbox.Outbox
	}{
		{"trigger", newOutbox},
		{"from Write", newOutboxNotifyFromWrite}, // Write's statement notifies, as the trigger does
	} {
		t.Run(c.name, func(t *testing.T) {
			db := dbtest.Postgres(t)
			ctx := context.Background()
			ob := c.make(t, db)
			conn := listenTo(t, db, ob)
			commitEvent(t, ob, "k", "no idle relay")
			_, err := db.ExecContext(ctx, `INSERT INTO `+ob.Table()+`_idle (token, until) VALUES ('expired', now() - interval '1 second')`)
			require.NoError(t, err)
			commitEvent(t, ob, "k", "an expired idle row")
			_, err = db.ExecContext(ctx, `INSERT INTO `+ob.Table()+`_idle (token, until) VALUES ('live', now() + interval '1 minute')`)
			require.NoError(t, err)
			commitEvent(t, ob, "k", "an idle relay")
			// Had either earlier write notified, the second notification
			// would be the last write's, which surely comes.
			got, err := notifications(conn)
			require.NotZero(t, got, "no notification: %v", err)
			require.Equal(t, 1, got, "notifications: only the write made while a relay was idle notifies")
			var n int
			require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+ob.Table()).Scan(&n))
			require.Equal(t, 3, n, "rows written")
		})
	}
}

// idleRows counts the live rows of the relay's token in the idle table.
func idleRows(t *testing.T, db *sql.DB, ob *outbox.Outbox, r *outbox.Relay) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRowContext(context.Background(),
		`SELECT COUNT(*) FROM `+ob.Table()+`_idle WHERE token = $1 AND until > now()`, r.Token()).Scan(&n))
	return n
}

// A write whose insert ran before the relay went idle (so it notified
// nobody) and that commits after the relay's last look is a lost wake-up:
// the relay's next poll finds it, one poll interval later at most. The
// relay's idle row is gone once it has rows to publish, and after Close.
func TestWriteRacingTheRelayGoingIdleIsFoundByItsNextPoll(t *testing.T) {
	db := dbtest.Postgres(t)
	ctx := context.Background()
	ob := newOutbox(t, db)
	// The insert runs now, with no relay idle: no notification is queued.
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = ob.Write(ctx, tx, outbox.Event{Key: "k", Payload: []byte("raced")})
	require.NoError(t, err)

	delivered := make(chan time.Time, 1)
	const poll = 500 * time.Millisecond
	r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		delivered <- time.Now()
		return nil
	}, outbox.WithLogger(quiet), outbox.WithPollInterval(poll))
	require.NoError(t, err)
	stop := runRelay(t, r)
	// Idle: the relay told writers to notify it, then looked once more
	// (a poll after the one that found it idle) and went to sleep.
	waitUntil(t, "relay idle", func() bool { return outbox.Idle(r) })
	p := r.Stats().Polls
	waitUntil(t, "relay's look after going idle", func() bool { return r.Stats().Polls >= p+2 })
	require.Equal(t, 1, idleRows(t, db, ob, r))

	committed := time.Now()
	require.NoError(t, tx.Commit())
	var at time.Time
	select {
	case at = <-delivered:
	case <-time.After(30 * time.Second):
		t.Fatal("a write racing the relay's going idle was never published")
	}
	require.Zero(t, r.Stats().Notifications, "the write notified (its insert ran before the relay was idle)")
	// One poll interval, plus a generous margin for a loaded machine.
	require.Less(t, at.Sub(committed), poll+10*time.Second)

	// Idle again, then closed: Close deletes the row.
	waitUntil(t, "relay idle again", func() bool { return outbox.Idle(r) })
	require.Equal(t, 1, idleRows(t, db, ob, r))
	stop()
	require.Zero(t, idleRows(t, db, ob, r), "idle row left after Close")
}

// A relay with rows to publish is busy: it deletes its idle row before it
// publishes them, so that writers stop notifying it (it polls meanwhile).
func TestRelayDeletesItsIdleRowBeforePublishing(t *testing.T) {
	db := dbtest.Postgres(t)
	ob := newOutbox(t, db)
	type seen struct {
		rows int
		idle bool
		err  error
	}
	var r *outbox.Relay
	during := make(chan seen, 1)
	r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		s := seen{idle: outbox.Idle(r)}
		s.err = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+ob.Table()+`_idle WHERE token = $1 AND until > now()`, r.Token()).Scan(&s.rows)
		during <- s
		return nil
	}, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Second))
	require.NoError(t, err)
	runRelay(t, r)
	waitUntil(t, "relay idle", func() bool { return outbox.Idle(r) })
	require.Equal(t, 1, idleRows(t, db, ob, r))
	commitEvent(t, ob, "k", "wakes the relay")
	select {
	case got := <-during:
		require.Equal(t, seen{0, false, nil}, got, "the relay's idle row while it publishes")
	case <-time.After(30 * time.Second):
		t.Fatal("event not published: no wake-up from an idle relay's notification")
	}
	require.EqualValues(t, 1, r.Stats().Notifications)
}
