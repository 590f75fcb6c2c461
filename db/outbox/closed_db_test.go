package outbox_test

import (
	"context"
	"database/sql"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// closableDB returns a *sql.DB of its own on the test's database (so that
// the test can close it) and a table name on it, dropped at the end through
// a connection of the test's.
func closableDB(t *testing.T, name string) (*sql.DB, string) {
	t.Helper()
	if name == "sqlite" {
		db := dbtest.SQLite(t)
		return db, dbtest.Table(t, db, "ob")
	}
	shared := dbtest.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := sqldb.OpenPostgres(ctx, dbtest.DSN())
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db, dbtest.Table(t, shared, "ob")
}

// A relay whose *sql.DB the caller closed can never make a call again:
// Run returns promptly (at its next poll) with an error wrapping
// ErrDBClosed and database/sql's error, instead of retrying it as a
// database outage until Close or WithMaxOutage (which it did before: the
// wait below timed out). The outbox's own calls wrap ErrDBClosed too.
func TestRelayOnAClosedDBReturnsErrDBClosed(t *testing.T) {
	for _, name := range []string{"sqlite", "postgres"} {
		t.Run(name, func(t *testing.T) {
			db, table := closableDB(t, name)
			ob, err := outbox.New(db, outbox.WithTable(table))
			require.NoError(t, err)
			require.NoError(t, ob.CreateSchema(context.Background()))
			writeEvents(t, ob, 2, 2, 4)
			rec := newRecorder(4)
			r, err := ob.NewRelay(rec.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(20*time.Millisecond))
			require.NoError(t, err)
			errc := make(chan error, 1)
			go func() { errc <- r.Run(context.Background()) }()
			defer r.Close(context.Background())
			rec.wait(t, 30*time.Second)

			require.NoError(t, db.Close())
			select {
			case err := <-errc:
				require.ErrorIs(t, err, outbox.ErrDBClosed)
				require.ErrorIs(t, err, sqldb.ErrDBClosed)
				require.ErrorContains(t, err, "sql: database is closed")
				t.Logf("Run: %v", err)
				require.NotErrorIs(t, err, outbox.ErrDatabaseUnavailable)
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not return on a closed *sql.DB (retried as an outage)")
			}

			ctx := context.Background()
			require.ErrorIs(t, ob.CreateSchema(ctx), outbox.ErrDBClosed)
			_, err = ob.Dead(ctx, 10)
			require.ErrorIs(t, err, outbox.ErrDBClosed)
			_, err = ob.Parked(ctx)
			require.ErrorIs(t, err, outbox.ErrDBClosed)
			require.ErrorIs(t, ob.Resume(ctx, "k"), outbox.ErrDBClosed)
			_, err = ob.Count(ctx)
			require.ErrorIs(t, err, outbox.ErrDBClosed)
			_, err = ob.Lookup(ctx, "some-id")
			require.ErrorIs(t, err, outbox.ErrDBClosed)
			_, err = ob.Recover(ctx, outbox.RecoverFilter{})
			require.ErrorIs(t, err, outbox.ErrDBClosed)

			// A relay started on the closed db returns at its schema
			// check.
			r2, err := ob.NewRelay(rec.sink, outbox.WithLogger(slog.New(slog.DiscardHandler)))
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() { done <- r2.Run(context.Background()) }()
			select {
			case err := <-done:
				require.ErrorIs(t, err, outbox.ErrDBClosed)
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not return on a closed *sql.DB")
			}
		})
	}
}
