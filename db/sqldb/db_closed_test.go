package sqldb_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/sqldb"
)

// database/sql's error for a call on a closed *sql.DB is unexported:
// IsDBClosed matches it by its text, wrapped or joined, and WrapDBClosed
// puts ErrDBClosed around it (once) so that errors.Is finds it. It is no
// connection error: a retry cannot pass.
func TestIsDBClosedMatchesDatabaseSQLsError(t *testing.T) {
	db, err := sqldb.OpenSQLite(t.TempDir() + "/x.db")
	require.NoError(t, err)
	require.NoError(t, db.Close())
	err = db.PingContext(context.Background())
	require.Error(t, err)
	require.True(t, sqldb.IsDBClosed(err))
	require.True(t, sqldb.IsDBClosed(fmt.Errorf("op: %w", err)))
	require.True(t, sqldb.IsDBClosed(errors.Join(errors.New("other"), err)))
	require.Equal(t, sqldb.KindOther, sqldb.Classify(err))

	w := sqldb.WrapDBClosed(fmt.Errorf("op: %w", err))
	require.ErrorIs(t, w, sqldb.ErrDBClosed)
	require.ErrorIs(t, w, err)
	require.Equal(t, w, sqldb.WrapDBClosed(w), "wrapped once")

	other := errors.New("sql: database is closing soon")
	require.False(t, sqldb.IsDBClosed(other))
	require.Equal(t, other, sqldb.WrapDBClosed(other))
	require.NoError(t, sqldb.WrapDBClosed(nil))
}
