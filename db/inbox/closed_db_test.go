package inbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/sqldb"
)

// Every call of an Inbox or Versions whose *sql.DB the caller closed
// returns an error wrapping ErrDBClosed (and keeping database/sql's "sql:
// database is closed"), so that a caller can tell it from an outage worth
// retrying: before, the error was database/sql's alone, which errors.Is
// cannot match (its value is unexported).
func TestCallsOnAClosedDBWrapErrDBClosed(t *testing.T) {
	for _, name := range []string{"sqlite", "postgres"} {
		t.Run(name, func(t *testing.T) {
			var db *sql.DB
			var table, vtable string
			if name == "sqlite" {
				db = dbtest.SQLite(t)
				table, vtable = "ib", "vs"
			} else {
				shared := dbtest.Postgres(t)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				var err error
				db, err = sqldb.OpenPostgres(ctx, dbtest.DSN())
				require.NoError(t, err)
				table, vtable = dbtest.Table(t, shared, "ib"), dbtest.Table(t, shared, "vs")
			}
			ctx := context.Background()
			in, err := inbox.New(db, inbox.WithTable(table), inbox.WithRetention(time.Hour))
			require.NoError(t, err)
			require.NoError(t, in.CreateSchema(ctx))
			v, err := inbox.NewVersions(db, inbox.WithTable(vtable))
			require.NoError(t, err)
			require.NoError(t, v.CreateSchema(ctx))
			require.NoError(t, db.Close())

			noop := func(*sql.Tx) error { return nil }
			closed := func(err error) {
				t.Helper()
				require.ErrorIs(t, err, inbox.ErrDBClosed)
				require.ErrorContains(t, err, "sql: database is closed")
			}
			closed(in.CreateSchema(ctx))
			_, err = in.Apply(ctx, "e1", noop)
			closed(err)
			_, err = in.Seen(ctx, "e1")
			closed(err)
			_, err = in.Cleanup(ctx)
			closed(err)
			closed(v.CreateSchema(ctx))
			_, err = v.Apply(ctx, "a", 1, noop)
			closed(err)
			_, _, err = v.Current(ctx, "a")
			closed(err)
		})
	}
}
