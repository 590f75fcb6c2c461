package outbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// A Write in a deferred transaction that read the table before another
// connection committed a write fails at once with SQLITE_BUSY_SNAPSHOT
// (WAL mode), whatever the busy timeout: its error says to begin write
// transactions IMMEDIATE and run the transaction again (it was a bare
// "database is locked (517)": the connection has a busy timeout, so the
// no-busy-timeout advice did not apply).
func TestWriteBusySnapshotSaysToBeginImmediate(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "snap.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	ob, err := outbox.New(db, outbox.WithTable("snap"))
	require.NoError(t, err)
	require.NoError(t, ob.CreateSchema(ctx))
	first, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer first.Rollback()
	var n int
	require.NoError(t, first.QueryRowContext(ctx, `SELECT COUNT(*) FROM snap`).Scan(&n)) // its snapshot
	second, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = ob.Write(ctx, second, outbox.Event{Key: "k"})
	require.NoError(t, err)
	require.NoError(t, second.Commit())
	_, err = ob.Write(ctx, first, outbox.Event{Key: "k"})
	require.Error(t, err)
	require.Equal(t, sqldb.KindConflict, sqldb.Classify(err), "%v", err)
	require.ErrorContains(t, err, "SQLITE_BUSY_SNAPSHOT")
	require.ErrorContains(t, err, "_txlock=immediate")
	require.NotContains(t, err.Error(), "no busy timeout")
}
