package sqldb_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/sqldb"
)

// modernc.org/sqlite ignores a query key it does not read (an upper-case
// _PRAGMA, a misspelt _txlok), and SQLite ignores an unknown URI
// parameter: the database opened without the setting asked for. OpenSQLite
// refuses them with ErrUnknownSQLiteParameter, naming the key and the keys
// read, and creates no file.
func TestOpenSQLiteRefusesUnknownParameters(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "x.db")
	for _, c := range []struct{ path, key, says string }{
		{file + "?_PRAGMA=synchronous(FULL)", "_PRAGMA", "case-sensitive: write _pragma"},
		{file + "?_pragma=synchronous(FULL)&_txlok=immediate", "_txlok", "_txlock"},
		{"file:" + file + "?mode=rwc&Mode=ro", "Mode", "write mode"},
		{"file:" + file + "?nocache=1", "nocache", "SQLite's mode, cache"},
	} {
		db, err := sqldb.OpenSQLite(c.path)
		require.ErrorIs(t, err, sqldb.ErrUnknownSQLiteParameter, c.path)
		require.Nil(t, db)
		require.ErrorContains(t, err, `"`+c.key+`"`, c.path)
		require.ErrorContains(t, err, c.says, c.path)
		require.ErrorContains(t, err, "_pragma, _txlock", c.path)
	}
	_, err := os.Stat(file)
	require.ErrorIs(t, err, os.ErrNotExist, "a refused name creates no file")

	// Every key the driver or SQLite reads is accepted: readonly_shm is
	// the unix VFS's (in modernc.org/sqlite's lib: sqlite3_uri_boolean of
	// "readonly_shm"), and was refused.
	db, err := sqldb.OpenSQLite("file:" + file + "?mode=rwc&cache=private&_time_format=sqlite&_fk=1&_dqs=0&readonly_shm=0")
	require.NoError(t, err)
	require.NoError(t, db.Close())
}

// On a plain file name the first "?" begins the query string (so the
// driver reads it): "a?b.db" would have opened the file "a", ignoring
// "b.db". OpenSQLite refuses it, giving the file: URI of the file a?b.db,
// which opens that file.
func TestOpenSQLiteRefusesAQuestionMarkInAPlainName(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a?b.db")
	db, err := sqldb.OpenSQLite(path)
	require.ErrorIs(t, err, sqldb.ErrUnknownSQLiteParameter)
	require.Nil(t, db)
	require.ErrorContains(t, err, `"b.db"`)
	uri := "file:" + filepath.Join(dir, "a%3Fb.db")
	require.ErrorContains(t, err, `write "`+uri+`"`)
	_, err = os.Stat(filepath.Join(dir, "a"))
	require.ErrorIs(t, err, os.ErrNotExist, "the file named by the part before the ? is not created")

	db, err = sqldb.OpenSQLite(uri)
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE t (a INTEGER)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	_, err = os.Stat(path)
	require.NoError(t, err, "the URI names the file a?b.db")
}
