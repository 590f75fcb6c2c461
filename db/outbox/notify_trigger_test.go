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

// notifyTriggers counts the outbox table's NOTIFY trigger and its function.
func notifyTriggers(t *testing.T, db *sql.DB, table string) (triggers, functions int) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, db.QueryRowContext(ctx,
		`SELECT COUNT(*) FROM pg_trigger WHERE tgname = $1 AND tgrelid = $2::regclass`, table+"_notify", table).Scan(&triggers))
	require.NoError(t, db.QueryRowContext(ctx,
		`SELECT COUNT(*) FROM pg_proc WHERE proname = $1 AND pronamespace = current_schema()::regnamespace`, table+"_notify").Scan(&functions))
	return triggers, functions
}

// WithNotify(false) makes CreateSchema drop the NOTIFY trigger (and its
// function) from an existing table, idempotently, and WithNotify(true)
// brings it back: switching is one CreateSchema, either way, any number of
// times.
func TestCreateSchemaSwitchesTheNotifyTrigger(t *testing.T) {
	db := dbtest.Postgres(t)
	ctx := context.Background()
	table := dbtest.Table(t, db, "ob")
	on, err := outbox.New(db, outbox.WithTable(table))
	require.NoError(t, err)
	off, err := outbox.New(db, outbox.WithTable(table), outbox.WithNotify(false))
	require.NoError(t, err)
	for _, step := range []struct {
		ob   *outbox.Outbox
		want int
	}{{on, 1}, {on, 1}, {off, 0}, {off, 0}, {on, 1}, {off, 0}} {
		require.NoError(t, step.ob.CreateSchema(ctx))
		tr, fn := notifyTriggers(t, db, table)
		require.Equal(t, [2]int{step.want, step.want}, [2]int{tr, fn}, "trigger and function after CreateSchema")
	}
	// Off on a fresh table: created without the trigger.
	fresh, err := outbox.New(db, outbox.WithTable(dbtest.Table(t, db, "ob")), outbox.WithNotify(false))
	require.NoError(t, err)
	require.NoError(t, fresh.CreateSchema(ctx))
	tr, fn := notifyTriggers(t, db, fresh.Table())
	require.Equal(t, [2]int{0, 0}, [2]int{tr, fn})
	// SQLite has no trigger either way.
	lite, err := outbox.New(dbtest.SQLite(t), outbox.WithNotify(false))
	require.NoError(t, err)
	require.NoError(t, lite.CreateSchema(ctx))
}

// Without the trigger a relay does not LISTEN (it would hold a connection
// for nothing) and finds committed writes by polling.
func TestRelayPollsWithoutNotifyTrigger(t *testing.T) {
	db := dbtest.Postgres(t)
	ctx := context.Background()
	ob, err := outbox.New(db, outbox.WithTable(dbtest.Table(t, db, "ob")), outbox.WithNotify(false))
	require.NoError(t, err)
	require.NoError(t, ob.CreateSchema(ctx))
	delivered := make(chan string, 10)
	r, _ := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
		delivered <- string(e.Payload)
		return nil
	}, outbox.WithLogger(quiet), outbox.WithPollInterval(20*time.Millisecond))
	for _, p := range []string{"first", "second"} {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = ob.Write(ctx, tx, outbox.Event{Key: "k", Payload: []byte(p)})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		select {
		case got := <-delivered:
			require.Equal(t, p, got)
		case <-time.After(30 * time.Second):
			t.Fatalf("event %s not delivered by polling", p)
		}
	}
	st := r.Stats()
	require.False(t, st.Listening)
	require.Zero(t, st.Notifications)
	var listeners int
	require.NoError(t, db.QueryRowContext(ctx,
		`SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND query = $1`,
		`LISTEN "`+ob.Table()+`"`).Scan(&listeners))
	require.Zero(t, listeners, "a connection LISTENs on a table without the trigger")
}
