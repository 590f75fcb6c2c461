package inbox_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
)

// Instances of a service starting at once each run CreateSchema on an
// empty PostgreSQL database: every call succeeds, for the inbox and for
// Versions. Without the advisory lock the outbox's CreateSchema takes, two
// concurrent CREATE TABLE IF NOT EXISTS of one name fail the later one with
// a unique violation of the catalog (pg_type_typname_nsp_index): an
// instance failed to start.
func TestConcurrentCreateSchemaOnAnEmptyDatabaseAllSucceed(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		for range 3 {
			in, err := inbox.New(db, inbox.WithTable(dbtest.Table(t, db, "ib")))
			require.NoError(t, err)
			v, err := inbox.NewVersions(db, inbox.WithTable(dbtest.Table(t, db, "ver")))
			require.NoError(t, err)
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for range 4 {
				wg.Add(2)
				go func() { defer wg.Done(); errs <- in.CreateSchema(ctx) }()
				go func() { defer wg.Done(); errs <- v.CreateSchema(ctx) }()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
		}
	})
}
