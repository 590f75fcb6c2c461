package inbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
)

// Every call before CreateSchema says the table is missing and to run
// CreateSchema (ErrNoSchema, naming the table), on both databases, as the
// outbox does: it returned the database's raw "no such table" / "relation
// does not exist".
func TestCallsBeforeCreateSchemaSaySo(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		table := dbtest.Table(t, db, "noschema")
		in, err := inbox.New(db, inbox.WithTable(table))
		require.NoError(t, err)
		_, err = in.Apply(ctx, "e1", func(*sql.Tx) error { return nil })
		require.ErrorIs(t, err, inbox.ErrNoSchema, "Apply")
		require.ErrorContains(t, err, table)
		_, err = in.Seen(ctx, "e1")
		require.ErrorIs(t, err, inbox.ErrNoSchema, "Seen")

		vt := dbtest.Table(t, db, "noschema_ver")
		v, err := inbox.NewVersions(db, inbox.WithTable(vt))
		require.NoError(t, err)
		_, err = v.Apply(ctx, "acct", 1, func(*sql.Tx) error { return nil })
		require.ErrorIs(t, err, inbox.ErrNoSchema, "Versions.Apply")
		require.ErrorContains(t, err, vt)
		_, _, err = v.Current(ctx, "acct")
		require.ErrorIs(t, err, inbox.ErrNoSchema, "Current")

		// Once created, the same calls work.
		require.NoError(t, in.CreateSchema(ctx))
		applied, err := in.Apply(ctx, "e1", func(*sql.Tx) error { return nil })
		require.NoError(t, err)
		require.True(t, applied)
	})
}

// Found by attacking the code (adversarial review, 2026-12-02): an Inbox and
// a Versions given one table name (CreateSchema of the second kept the
// first's table; it now refuses it, ErrSchemaConflict, but an application
// may go on, or run Schema()'s SQL itself) failed on SQLite with the raw "table ... has no column
// named entity", while PostgreSQL's "column does not exist" was ErrNoSchema.
//
// A table of the other's shape is ErrNoSchema, naming the table, on both
// databases, for every call that writes or reads it.
func TestATableOfAnotherShapeIsErrNoSchema(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		for _, inboxFirst := range []bool{true, false} {
			table := dbtest.Table(t, db, "shape")
			in, err := inbox.New(db, inbox.WithTable(table))
			require.NoError(t, err)
			v, err := inbox.NewVersions(db, inbox.WithTable(table))
			require.NoError(t, err)
			if inboxFirst {
				require.NoError(t, in.CreateSchema(ctx))
				// Refused (the inbox's table stays): the calls below
				// are those of an application that went on anyway.
				require.ErrorIs(t, v.CreateSchema(ctx), inbox.ErrSchemaConflict)
				_, err = v.Apply(ctx, "acct", 1, func(*sql.Tx) error { return nil })
				require.ErrorIs(t, err, inbox.ErrNoSchema, "Versions.Apply")
				require.ErrorContains(t, err, table)
				_, _, err = v.Current(ctx, "acct")
				require.ErrorIs(t, err, inbox.ErrNoSchema, "Current")
			} else {
				require.NoError(t, v.CreateSchema(ctx))
				// Refused: the versions table stays.
				require.ErrorIs(t, in.CreateSchema(ctx), inbox.ErrSchemaConflict)
				_, err = in.Apply(ctx, "e1", func(*sql.Tx) error { return nil })
				require.ErrorIs(t, err, inbox.ErrNoSchema, "Apply")
				require.ErrorContains(t, err, table)
				_, err = in.Seen(ctx, "e1")
				require.ErrorIs(t, err, inbox.ErrNoSchema, "Seen")
			}
		}
	})
}
