package sqldb_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/sqldb"
)

// A name with its own query string keeps the caller's parameters and gets
// OpenSQLite's settings too, the caller's winning where both set the same
// one. Before, OpenSQLite appended "?" and its settings to the name:
// x.db?_pragma=synchronous(FULL) created x.db, then failed with `near "?":
// syntax error` (the second "?" ended up in the pragma), and
// file:x.db?mode=ro read a busy timeout of 0 (OpenSQLite's settings were
// lost inside the caller's last value).
func TestOpenSQLiteMergesCallersParameters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")

	db, err := sqldb.OpenSQLite(path + "?_pragma=synchronous(FULL)")
	require.NoError(t, err)
	defer db.Close()
	var n int
	var mode string
	require.NoError(t, db.QueryRow(`PRAGMA synchronous`).Scan(&n))
	require.Equal(t, 2, n, "the caller's synchronous(FULL) wins")
	require.NoError(t, db.QueryRow(`PRAGMA busy_timeout`).Scan(&n))
	require.Equal(t, 10000, n, "OpenSQLite's busy timeout is added")
	require.NoError(t, db.QueryRow(`PRAGMA journal_mode`).Scan(&mode))
	require.Equal(t, "wal", mode)
	_, err = db.Exec(`CREATE TABLE t (a INTEGER)`)
	require.NoError(t, err)

	// The driver's shorthand is the caller's setting too.
	short, err := sqldb.OpenSQLite(path + "?_busy_timeout=2500")
	require.NoError(t, err)
	defer short.Close()
	require.NoError(t, short.QueryRow(`PRAGMA busy_timeout`).Scan(&n))
	require.Equal(t, 2500, n)

	// A file: URI keeps SQLite's own parameters: mode=ro holds, with
	// OpenSQLite's busy timeout.
	ro, err := sqldb.OpenSQLite("file:" + path + "?mode=ro")
	require.NoError(t, err)
	defer ro.Close()
	require.NoError(t, ro.QueryRow(`PRAGMA busy_timeout`).Scan(&n))
	require.Equal(t, 10000, n)
	require.NoError(t, ro.QueryRow(`SELECT COUNT(*) FROM t`).Scan(&n))
	_, err = ro.Exec(`INSERT INTO t VALUES (1)`)
	require.Error(t, err, "mode=ro: the database is read-only")
	require.Equal(t, sqldb.KindStorage, sqldb.Classify(err), "%v", err)
}

// SQLite reads mode, cache and its other URI parameters only from a file:
// URI: on a plain file name they are ignored (x.db?mode=ro opened a
// writable database), so OpenSQLite refuses them, saying how to write the
// URI, and creates no file. A query string that does not parse, and an
// empty name, are refused too.
func TestOpenSQLiteRefusesURIParametersOnAFileName(t *testing.T) {
	file := filepath.Join(t.TempDir(), "x.db")
	for _, q := range []string{"?mode=ro", "?cache=shared", "?_pragma=busy_timeout(1)&immutable=1"} {
		db, err := sqldb.OpenSQLite(file + q)
		require.Error(t, err, q)
		require.Nil(t, db)
		require.ErrorContains(t, err, `"file:`+file+q+`"`, q)
	}
	_, err := sqldb.OpenSQLite(file + "?a=%zz")
	require.ErrorContains(t, err, "query string")
	_, err = sqldb.OpenSQLite("?_txlock=immediate")
	require.ErrorContains(t, err, "empty path")
	_, err = os.Stat(file)
	require.ErrorIs(t, err, os.ErrNotExist, "a refused name creates no file")
}

// An in-memory or temporary database is per connection: each connection of
// the pool would get its own, so a schema created on one is missing on the
// others. OpenSQLite refuses every form with ErrInMemorySQLite, saying to
// use a file in a temporary directory. Before, it accepted them (and the
// outbox's CreateSchema returned nil, then concurrent Writes failed with
// "table missing: run CreateSchema"; file::memory:?cache=shared failed with
// "no such cache mode: shared?_pragma=...").
func TestOpenSQLiteRefusesInMemoryDatabases(t *testing.T) {
	for _, path := range []string{
		":memory:",
		":memory:?_txlock=immediate",
		"file::memory:",
		"file::memory:?cache=shared",
		"file:app?mode=memory&cache=shared",
		"file:",
		"file:?cache=shared",
		"file://",
		// SQLite decodes the name, and reads every mode, the last winning.
		"file:%3Amemory%3A",
		"file:x.db?mode=rwc&mode=memory",
		// The memdb VFS, on a name not beginning with "/".
		"file:x.db?vfs=memdb",
		"x.db?vfs=memdb",
	} {
		db, err := sqldb.OpenSQLite(path)
		require.ErrorIs(t, err, sqldb.ErrInMemorySQLite, path)
		require.ErrorContains(t, err, "temporary directory", path)
		require.Nil(t, db)
	}
}

// The caller's query string reaches SQLite as written: SQLite decodes a
// file: URI's parameters itself and reads "+" as "+". Before, OpenSQLite
// parsed and re-encoded it, so modeof naming "a b.db" (a%20b.db) reached
// SQLite as a+b.db: disk I/O error.
func TestOpenSQLiteKeepsTheCallersQueryAsWritten(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a b.db"), nil, 0o600))
	db, err := sqldb.OpenSQLite("file:" + filepath.Join(dir, "x.db") + "?modeof=" + filepath.Join(dir, "a%20b.db"))
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE t (a INTEGER)`)
	require.NoError(t, err)
	var n int
	require.NoError(t, db.QueryRow(`PRAGMA busy_timeout`).Scan(&n))
	require.Equal(t, 10000, n, "OpenSQLite's settings are added")
}

// The file: URI that OpenSQLite's refusal of a plain name with SQLite's
// parameters says to write names the same file: "#" and "%" in the name
// are escaped (SQLite ends a URI's name at "#" and decodes "%XX"). Before,
// it said to write "file:" + the name: for /d/a#b/x.db?mode=ro, a URI of
// the file /d/a.
func TestOpenSQLiteSuggestsAURINamingTheSameFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a#b%41c")
	require.NoError(t, os.Mkdir(dir, 0o700))
	file := filepath.Join(dir, "x.db")
	db, err := sqldb.OpenSQLite(file)
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE t (a INTEGER)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	// "//" + an absolute name is the same file; in a URI, "//" begins
	// an authority.
	for _, name := range []string{file, "/" + file} {
		_, err = sqldb.OpenSQLite(name + "?mode=ro")
		require.Error(t, err)
		m := regexp.MustCompile(`write "([^"]*)"`).FindStringSubmatch(err.Error())
		require.NotNil(t, m, "%v", err)
		ro, err := sqldb.OpenSQLite(m[1])
		require.NoError(t, err, m[1])
		var n int
		require.NoError(t, ro.QueryRow(`SELECT COUNT(*) FROM t`).Scan(&n), "%s: the table of %s", m[1], file)
		_, err = ro.Exec(`INSERT INTO t VALUES (1)`)
		require.Error(t, err, "mode=ro holds")
		require.NoError(t, ro.Close())
	}
}
