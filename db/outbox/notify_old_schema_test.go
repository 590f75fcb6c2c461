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

// On a schema of the version before the idle table (its trigger notifies
// every write), a relay finds no idle table, says so once and counts no
// database error, and is woken by every write's notification.
func TestRelayOnSchemaWithoutIdleTableIsWokenByEveryWrite(t *testing.T) {
	db := dbtest.Postgres(t)
	ob := newOutbox(t, db)
	preIdleSchema(t, db, ob)
	delivered := make(chan string, 10)
	r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		delivered <- string(e.Payload)
		return nil
	}, outbox.WithLogger(quiet), outbox.WithPollInterval(time.Minute))
	require.NoError(t, err)
	runRelay(t, r)
	waitUntil(t, "listening", func() bool { return r.Stats().Listening })
	waitPolls(t, r, 0)
	for i, p := range []string{"one", "two"} {
		commitEvent(t, ob, "k", p)
		select {
		case got := <-delivered:
			require.Equal(t, p, got)
		case <-time.After(20 * time.Second):
			t.Fatalf("write %d not published: no notification (a minute's poll)", i)
		}
	}
	require.False(t, outbox.Idle(r))
	require.Zero(t, r.Stats().DBErrors)
}

// A relay started on a schema without the idle table, once CreateSchema has
// upgraded it (the new trigger notifies only while a relay is idle), is
// woken by writes again: it looks for the idle table again every third of a
// lease while idle. It used to give up for good at the first try, and poll
// only until restarted.
func TestRelayStartedBeforeTheIdleTableIsWokenAfterTheUpgrade(t *testing.T) {
	db := dbtest.Postgres(t)
	ctx := context.Background()
	ob := newOutbox(t, db)
	preIdleSchema(t, db, ob)
	delivered := make(chan string, 10)
	r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		delivered <- string(e.Payload)
		return nil
	}, outbox.WithLogger(quiet), outbox.WithPollInterval(100*time.Millisecond), outbox.WithLeaseDuration(600*time.Millisecond))
	require.NoError(t, err)
	runRelay(t, r)
	waitUntil(t, "listening", func() bool { return r.Stats().Listening })
	waitPolls(t, r, 2)
	require.False(t, outbox.Idle(r), "an idle row written without the idle table")
	require.NoError(t, ob.CreateSchema(ctx))
	waitUntil(t, "the relay idle after the upgrade", func() bool { return outbox.Idle(r) && idleRows(t, db, ob, r) == 1 })
	before := r.Stats().Notifications
	commitEvent(t, ob, "k", "after the upgrade")
	select {
	case got := <-delivered:
		require.Equal(t, "after the upgrade", got)
	case <-time.After(30 * time.Second):
		t.Fatal("never published")
	}
	require.Greater(t, r.Stats().Notifications, before, "the write notified the relay")
}

// preIdleSchema puts ob's table back to the schema before the idle table:
// no <table>_idle, and a trigger notifying every write.
func preIdleSchema(t *testing.T, db *sql.DB, ob *outbox.Outbox) {
	t.Helper()
	tb := ob.Table()
	for _, q := range []string{
		`DROP TABLE ` + tb + `_idle`,
		`CREATE OR REPLACE FUNCTION ` + tb + `_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify('` + tb + `', '');
	RETURN NULL;
END $$`,
	} {
		_, err := db.ExecContext(context.Background(), q)
		require.NoError(t, err)
	}
}
