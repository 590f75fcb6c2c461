package outbox_test

import (
	"context"
	"database/sql"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// On a PostgreSQL database whose default_transaction_isolation is
// SERIALIZABLE (or REPEATABLE READ, which the inbox supports), concurrent
// CreateSchemas of an outbox and an inbox given one name take turns, and
// the later one sees the earlier one's table: ErrSchemaConflict. Its check
// read the catalog with the snapshot its transaction took at its first
// statement, the advisory lock's, before the wait: it found the name free,
// CREATE TABLE IF NOT EXISTS skipped the other's table without a word, and
// the call failed on a missing column (the inbox's index), or succeeded on
// the other's table (Versions on an inbox's).
func TestCreateSchemaUnderSerializableSeesAConcurrentSchema(t *testing.T) {
	shared := dbtest.Postgres(t)
	db := openWithIsolation(t, "serializable")
	ctx := context.Background()
	for range 3 {
		name := dbtest.Table(t, shared, "ser")
		dropAfter(t, shared, name+"_processed_at")
		ob := mustOutbox(t, db, name)
		in := mustInbox(t, db, name)
		v, err := inbox.NewVersions(db, inbox.WithTable(name))
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i, f := range []func(context.Context) error{ob.CreateSchema, in.CreateSchema, v.CreateSchema, ob.CreateSchema} {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = f(ctx) }()
		}
		wg.Wait()
		ok := 0
		for _, err := range errs {
			if err == nil {
				ok++
				continue
			}
			require.ErrorIs(t, err, outbox.ErrSchemaConflict)
		}
		require.NotZero(t, ok, "one schema is created")
	}
}

// openWithIsolation opens a *sql.DB of its own on the test database whose
// connections default to the isolation level given.
func openWithIsolation(t *testing.T, level string) *sql.DB {
	t.Helper()
	dsn, opt := dbtest.DSN(), "-c default_transaction_isolation="+level
	if strings.Contains(dsn, "://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + "options=" + url.QueryEscape(opt)
	} else {
		dsn += " options='" + opt + "'"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := sqldb.OpenPostgres(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	var got string
	require.NoError(t, db.QueryRow(`SHOW default_transaction_isolation`).Scan(&got))
	require.Equal(t, level, got)
	return db
}
