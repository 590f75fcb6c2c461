package inbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/sqldb"
)

// A Record that meets another writer's lock on a SQLite file opened without
// a busy timeout (a plain sql.Open) fails with SQLITE_BUSY (a conflict, by
// sqldb.Classify) whose text says what to do: open the database with
// sqldb.OpenSQLite. Before, it was the bare "database is locked".
func TestRecordBusyWithoutBusyTimeoutSaysWhatToDo(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "plain.db"))
	require.NoError(t, err)
	defer db.Close()
	in, err := inbox.New(db)
	require.NoError(t, err)
	require.NoError(t, in.CreateSchema(ctx))
	first, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer first.Rollback()
	_, err = in.Record(ctx, first, "e1") // takes the write lock
	require.NoError(t, err)
	second, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer second.Rollback()
	_, err = in.Record(ctx, second, "e2")
	require.Error(t, err)
	require.Equal(t, sqldb.KindConflict, sqldb.Classify(err), "%v", err)
	require.ErrorContains(t, err, "busy_timeout")
	require.ErrorContains(t, err, "sqldb.OpenSQLite")
}
