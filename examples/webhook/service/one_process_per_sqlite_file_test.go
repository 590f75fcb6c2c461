package service

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A second Store on an open SQLite file is refused at once, naming the file
// and the holder (one process per SQLite file); the file opens again once
// the first Store is closed. Before, a second process started and took the
// first one's partner leases over ("lease on key lost").
func TestSecondStoreOnOneSQLiteFileIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "webhook.db")
	first, err := OpenSQLite(t.Context(), path)
	require.NoError(t, err)
	second, err := OpenSQLite(t.Context(), path)
	if err == nil {
		_ = second.Close()
	}
	require.ErrorIs(t, err, ErrSQLiteInUse)
	require.ErrorContains(t, err, path)
	require.ErrorContains(t, err, "pid ")
	require.NoError(t, first.Close())
	again, err := OpenSQLite(t.Context(), path)
	require.NoError(t, err)
	require.NoError(t, again.Close())
}
