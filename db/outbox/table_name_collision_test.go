package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// A table named x plus a suffix the schemas derive names with (x_lease,
// x_dead, x_processed_at, ...) shares its name with an object of the
// outbox or inbox x in the same database: each one's CREATE ... IF NOT
// EXISTS would skip the other's (an outbox "x_lease" running on the lease
// table of the outbox "x"). WithTable refuses such names, in the outbox,
// the inbox and Versions alike, naming the suffix and the other table; a
// name with the suffix inside it is fine.
func TestWithTableRefusesNamesEndingInADerivedSuffix(t *testing.T) {
	db := dbtest.SQLite(t)
	for _, s := range sqldb.DerivedSuffixes {
		name := "orders" + s
		_, obErr := outbox.New(db, outbox.WithTable(name))
		_, ibErr := inbox.New(db, inbox.WithTable(name))
		_, vErr := inbox.NewVersions(db, inbox.WithTable(name))
		for _, err := range []error{obErr, ibErr, vErr} {
			var oe *keysched.OptionError
			require.True(t, errors.As(err, &oe), "%s: %v", name, err)
			require.Equal(t, "WithTable", oe.Option)
			require.ErrorIs(t, err, keysched.ErrInvalidOption)
			require.ErrorContains(t, err, `ends in "`+s+`"`)
			require.ErrorContains(t, err, `named "orders"`)
		}
		require.ErrorIs(t, obErr, outbox.ErrInvalidOption)
		require.ErrorIs(t, ibErr, inbox.ErrInvalidOption)
		_, err := outbox.New(db, outbox.WithTable("orders"+s+"_v2"))
		require.NoError(t, err, "the suffix inside the name")
	}
}

// CreateSchema refuses, with ErrSchemaConflict and creating nothing, when a
// name its schema creates is held by another object: the inbox's or the
// outbox's table of the same name, the application's table or index, an
// object of another kind. Before, CREATE ... IF NOT EXISTS skipped it: on
// PostgreSQL an index name held by a table was skipped without a word (the
// outbox ran without its index); a table held by another schema's made the
// next statement fail with "column ... does not exist", or ran on it.
func TestCreateSchemaRefusesANameHeldByAnotherObject(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		pg := dbtest.Name(db) == "postgres"
		ts := "INTEGER"
		if pg {
			ts = "TIMESTAMPTZ"
		}
		for _, c := range []struct {
			name string
			// before makes the objects that hold the names (x is the
			// table name); then makes the schema that must be refused.
			before func(x string)
			then   func(x string) error
			says   []string
		}{
			{"inbox on an outbox's table", func(x string) {
				require.NoError(t, mustOutbox(t, db, x).CreateSchema(ctx))
			}, func(x string) error {
				return mustInbox(t, db, x).CreateSchema(ctx)
			}, []string{"the inbox table %s needs the table %s with the columns id, processed_at", "lacks processed_at"}},
			{"outbox on an inbox's table", func(x string) {
				require.NoError(t, mustInbox(t, db, x).CreateSchema(ctx))
			}, func(x string) error {
				return mustOutbox(t, db, x).CreateSchema(ctx)
			}, []string{"the outbox table %s needs the table %s", "lacks seq, key, type"}},
			{"versions on an inbox's table", func(x string) {
				require.NoError(t, mustInbox(t, db, x).CreateSchema(ctx))
			}, func(x string) error {
				v, err := inbox.NewVersions(db, inbox.WithTable(x))
				require.NoError(t, err)
				return v.CreateSchema(ctx)
			}, []string{"the versions table %s needs the table %s", "lacks entity, version"}},
			{"an application's table holding an index's name", func(x string) {
				execSQL(t, db, `CREATE TABLE `+x+`_dead (a INTEGER)`)
			}, func(x string) error {
				return mustOutbox(t, db, x).CreateSchema(ctx)
			}, []string{"needs the index %[1]s_dead on %[1]s, but %[1]s_dead is a table"}},
			{"another table's index holding an index's name", func(x string) {
				execSQL(t, db, `CREATE TABLE `+x+`_other (owner TEXT)`)
				execSQL(t, db, `CREATE INDEX `+x+`_lease_owner ON `+x+`_other (owner)`)
			}, func(x string) error {
				return mustOutbox(t, db, x).CreateSchema(ctx)
			}, []string{"needs the index %[1]s_lease_owner on %[1]s_lease, but %[1]s_lease_owner is an index on %[1]s_other"}},
			{"an application's table holding the lease table's name", func(x string) {
				execSQL(t, db, `CREATE TABLE `+x+`_lease (key TEXT PRIMARY KEY, val TEXT)`)
			}, func(x string) error {
				return mustOutbox(t, db, x).CreateSchema(ctx)
			}, []string{"needs the table %[1]s_lease with the columns key, owner, expires_at", "lacks owner, expires_at"}},
			{"an application's table holding the epoch counter's name", func(x string) {
				execSQL(t, db, `CREATE TABLE `+x+`_lease_epoch (a INTEGER)`)
			}, func(x string) error {
				return mustOutbox(t, db, x).CreateSchema(ctx)
			}, []string{map[bool]string{true: "needs the sequence %[1]s_lease_epoch, but %[1]s_lease_epoch is a table", false: "needs the table %[1]s_lease_epoch with the columns id, n"}[pg]}},
		} {
			t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
				x := dbtest.Table(t, db, "tc")
				dropAfter(t, db, x+"_dead", x+"_other", x+"_lease_epoch")
				c.before(x)
				err := c.then(x)
				require.ErrorIs(t, err, sqldb.ErrSchemaConflict)
				require.ErrorIs(t, err, outbox.ErrSchemaConflict)
				require.ErrorIs(t, err, inbox.ErrSchemaConflict)
				for _, s := range c.says {
					if strings.Count(s, "%s") == 2 {
						s = strings.ReplaceAll(s, "%s", x)
					} else {
						s = strings.ReplaceAll(s, "%[1]s", x)
					}
					require.ErrorContains(t, err, s)
				}
				if !strings.Contains(c.name, " on ") {
					_, err := db.Exec(`SELECT 1 FROM ` + x + ` LIMIT 0`)
					require.Error(t, err, "nothing created: no table %s", x)
				}
			})
		}

		// The outbox's own schema, and a lease table of an older version
		// (no token or epoch column: CreateSchema adds them), pass.
		t.Run("own_and_older_schema", func(t *testing.T) {
			x := dbtest.Table(t, db, "tc")
			execSQL(t, db, `CREATE TABLE `+x+`_lease (key TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at `+ts+` NOT NULL)`)
			ob := mustOutbox(t, db, x)
			require.NoError(t, ob.CreateSchema(ctx))
			require.NoError(t, ob.CreateSchema(ctx))
			in := mustInbox(t, db, x+"_in")
			require.NoError(t, in.CreateSchema(ctx))
			require.NoError(t, in.CreateSchema(ctx))
		})
	})
}

func mustOutbox(t *testing.T, db *sql.DB, table string) *outbox.Outbox {
	t.Helper()
	ob, err := outbox.New(db, outbox.WithTable(table))
	require.NoError(t, err)
	return ob
}

func mustInbox(t *testing.T, db *sql.DB, table string) *inbox.Inbox {
	t.Helper()
	in, err := inbox.New(db, inbox.WithTable(table))
	require.NoError(t, err)
	return in
}

func execSQL(t *testing.T, db *sql.DB, stmt string) {
	t.Helper()
	_, err := db.Exec(stmt)
	require.NoError(t, err, stmt)
}

// dropAfter drops the tables names (and their indexes) when t ends.
func dropAfter(t *testing.T, db *sql.DB, names ...string) {
	t.Cleanup(func() {
		for _, n := range names {
			_, _ = db.Exec(`DROP TABLE IF EXISTS ` + n) // best effort: named for this test only
		}
	})
}

// On PostgreSQL CreateSchema replaces <table>_notify() (the NOTIFY
// trigger's function), or drops it with WithNotify(false): an application's
// function of that name is refused (ErrSchemaConflict), and kept, where it
// was replaced or dropped without a word. The function of an older version
// of the schema (its body notifies the table's channel) is the outbox's.
func TestCreateSchemaRefusesAnApplicationsFunctionOfTheNotifyName(t *testing.T) {
	db := dbtest.Postgres(t)
	ctx := context.Background()
	for _, notify := range []bool{true, false} {
		x := dbtest.Table(t, db, "fn")
		execSQL(t, db, `CREATE FUNCTION `+x+`_notify() RETURNS integer LANGUAGE sql AS $$ SELECT 42 $$`)
		t.Cleanup(func() { _, _ = db.Exec(`DROP FUNCTION IF EXISTS ` + x + `_notify()`) })
		ob, err := outbox.New(db, outbox.WithTable(x), outbox.WithNotify(notify))
		require.NoError(t, err)
		err = ob.CreateSchema(ctx)
		require.ErrorIs(t, err, outbox.ErrSchemaConflict, "notify %v", notify)
		require.ErrorContains(t, err, x+"_notify()")
		var n int
		require.NoError(t, db.QueryRow(`SELECT `+x+`_notify()`).Scan(&n), "the application's function is kept")
		require.Equal(t, 42, n)
	}
	// An older version's function: CreateSchema replaces it.
	x := dbtest.Table(t, db, "fn")
	execSQL(t, db, `CREATE FUNCTION `+x+`_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify('`+x+`', '');
	RETURN NULL;
END
$$`)
	require.NoError(t, mustOutbox(t, db, x).CreateSchema(ctx))
}
