package sqldb_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/sqldb"
)

// Classify puts each database error in its kind, through wrapping.
func TestClassify(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("outbox: op: %w", &pgconn.PgError{Code: code}) }
	for _, c := range []struct {
		err  error
		want sqldb.ErrorKind
	}{
		{nil, sqldb.KindOther},
		{errors.New("boom"), sqldb.KindOther},
		{pg("23505"), sqldb.KindOther},
		{pg("08006"), sqldb.KindConnection},
		{pg("57P01"), sqldb.KindConnection},
		{pg("57P03"), sqldb.KindConnection},
		{pg("53300"), sqldb.KindConnection},
		{pg("57014"), sqldb.KindTimeout},
		{pg("55P03"), sqldb.KindTimeout},
		{pg("40P01"), sqldb.KindConflict},
		{pg("40001"), sqldb.KindConflict},
		{pg("42P01"), sqldb.KindSchema},
		{pg("42703"), sqldb.KindSchema},
		{pg("25006"), sqldb.KindStorage},
		{pg("53100"), sqldb.KindStorage},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), sqldb.KindTimeout},
		{context.Canceled, sqldb.KindOther},
		{fmt.Errorf("x: %w", driver.ErrBadConn), sqldb.KindConnection},
		{fmt.Errorf("x: %w", io.ErrUnexpectedEOF), sqldb.KindConnection},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), sqldb.KindConnection},
	} {
		require.Equal(t, c.want, sqldb.Classify(c.err), "%v", c.err)
	}
	// SQLite: a missing table, busy.
	db, err := sqldb.OpenSQLite(filepath.Join(t.TempDir(), "x.db"))
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`SELECT * FROM missing`)
	require.Equal(t, sqldb.KindSchema, sqldb.Classify(err), "%v", err)
	require.Equal(t, "schema", sqldb.KindSchema.String())
	require.Equal(t, "storage", sqldb.KindStorage.String())
}
