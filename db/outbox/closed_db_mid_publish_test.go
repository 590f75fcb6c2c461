package outbox_test

import (
	"context"
	"database/sql"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// A relay whose *sql.DB is closed while its sink publishes a row (the mark
// then fails) and Close is called: Run returns (nil, or an error wrapping
// ErrDBClosed when a call failed before Close), Close returns saying that
// the published rows were not marked, and nothing is reported marked: Marked is 0,
// the mark hook never ran, and the rows are still pending in the table (read
// through another *sql.DB), to be published again.
func TestRelayWhoseDBClosesMidPublishMarksNothing(t *testing.T) {
	for _, name := range []string{"sqlite", "postgres"} {
		t.Run(name, func(t *testing.T) {
			db, table := closableDB(t, name)
			var other *sql.DB
			if name == "sqlite" {
				var seq int
				var schema, file string
				require.NoError(t, db.QueryRow(`PRAGMA database_list`).Scan(&seq, &schema, &file))
				var err error
				other, err = sqldb.OpenSQLite(file)
				require.NoError(t, err)
				t.Cleanup(func() { other.Close() })
			} else {
				other = dbtest.Postgres(t)
			}
			ob, err := outbox.New(db, outbox.WithTable(table))
			require.NoError(t, err)
			require.NoError(t, ob.CreateSchema(context.Background()))
			writeEvents(t, ob, 2, 1, 2)
			entered := make(chan struct{}, 2)
			release := make(chan struct{})
			var hooked atomic.Int64
			r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
				entered <- struct{}{}
				<-release
				return nil
			}, outbox.WithLogger(quiet), outbox.WithPollInterval(20*time.Millisecond),
				outbox.WithMarkHook(func(ctx context.Context, tx *sql.Tx, rows []outbox.Marked) error {
					hooked.Add(int64(len(rows)))
					return nil
				}))
			require.NoError(t, err)
			errc := make(chan error, 1)
			go func() { errc <- r.Run(context.Background()) }()
			for range 2 {
				select {
				case <-entered:
				case <-time.After(30 * time.Second):
					t.Fatal("the sink was never called")
				}
			}
			require.NoError(t, db.Close())
			closed := make(chan error, 1)
			go func() { closed <- r.Close(context.Background()) }()
			close(release)
			select {
			case err := <-errc:
				// nil when Close came before a call failed.
				if err != nil {
					require.ErrorIs(t, err, outbox.ErrDBClosed)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return on a closed *sql.DB")
			}
			select {
			case err := <-closed:
				require.ErrorContains(t, err, "2 published rows not marked sent")
			case <-time.After(30 * time.Second):
				t.Fatal("Close did not return on a closed *sql.DB")
			}
			st := r.Stats()
			require.Zero(t, st.Marked, "rows reported marked on a closed *sql.DB")
			require.Zero(t, hooked.Load(), "the mark hook ran on a closed *sql.DB")
			var pending int
			require.NoError(t, other.QueryRow(`SELECT COUNT(*) FROM `+table+` WHERE state = 0`).Scan(&pending))
			require.Equal(t, 2, pending)
		})
	}
}
