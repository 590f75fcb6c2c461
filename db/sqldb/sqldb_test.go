package sqldb_test

import (
	"database/sql"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/sqldb"
)

func TestRebind(t *testing.T) {
	q := `SELECT a FROM t WHERE b = ? AND c IN (?, ?)`
	require.Equal(t, `SELECT a FROM t WHERE b = $1 AND c IN ($2, $3)`, sqldb.Rebind(sqldb.Postgres, q))
	require.Equal(t, q, sqldb.Rebind(sqldb.SQLite, q))
}

func TestValidIdent(t *testing.T) {
	for _, ok := range []string{"keysched_outbox", "_x", "a1"} {
		require.True(t, sqldb.ValidIdent(ok), ok)
	}
	for _, bad := range []string{"", "1a", "A", "a-b", "a.b", "a;drop", "x\x00", string(make([]byte, 49)), "select", "user"} {
		require.False(t, sqldb.ValidIdent(bad), "%q", bad)
	}
	require.True(t, sqldb.Reserved("order"))
	require.False(t, sqldb.Reserved("key"), "a keyword both databases take as a table name")
}

func TestDetectAndOpen(t *testing.T) {
	db, err := sqldb.OpenSQLite(t.TempDir() + "/x.db")
	require.NoError(t, err)
	defer db.Close()
	d, err := sqldb.Detect(db)
	require.NoError(t, err)
	require.Equal(t, sqldb.SQLite, d)
	var mode string
	require.NoError(t, db.QueryRow(`PRAGMA journal_mode`).Scan(&mode))
	require.Equal(t, "wal", mode)

	pg, err := sql.Open("pgx", "host=/nonexistent")
	require.NoError(t, err)
	defer pg.Close()
	d, err = sqldb.Resolve(pg, sqldb.Auto)
	require.NoError(t, err)
	require.Equal(t, sqldb.Postgres, d)
	_, err = sqldb.Resolve(pg, sqldb.Dialect(7))
	require.ErrorIs(t, err, sqldb.ErrUnknownDialect)
	_, err = sqldb.Detect(nil)
	require.Error(t, err)
	_, err = sqldb.OpenSQLite("")
	require.Error(t, err)

	// A uniqueness violation is recognised on SQLite.
	_, err = db.Exec(`CREATE TABLE u (id TEXT PRIMARY KEY)`)
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO u VALUES ('a')`)
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO u VALUES ('a')`)
	require.True(t, sqldb.IsUniqueViolation(err), "%v", err)
	require.False(t, sqldb.IsUniqueViolation(errors.New("other")))
}

// OpenPostgres with a nil context is an error, not a panic (a new user's
// sqldb.OpenPostgres(nil, dsn) dereferenced nil in PingContext).
func TestOpenPostgresNilContext(t *testing.T) {
	db, err := sqldb.OpenPostgres(nil, "host=/nonexistent dbname=x") //nolint:staticcheck // SA1012: the nil context is the input under test
	require.ErrorIs(t, err, keysched.ErrNilContext)
	require.Nil(t, db)
}

// StorableText makes text CheckText accepts: NUL bytes and invalid UTF-8
// become U+FFFD; valid text is kept as it is.
func TestStorableText(t *testing.T) {
	for in, want := range map[string]string{
		"ok, ünïcode": "ok, ünïcode",
		"a\x00b":      "a\uFFFDb",
		"a\xffb":      "a\uFFFDb",
		"":            "",
	} {
		got := sqldb.StorableText(in)
		require.Equal(t, want, got, "%q", in)
		require.NoError(t, sqldb.CheckText("text", got, 100))
	}
}
