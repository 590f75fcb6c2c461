package inbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/sqldb"
)

// An Apply called inside another's fn for the same event ID (or a Versions
// Apply for the same entity) waits for its own outer transaction: the
// second insert waits for the first's uncommitted row (PostgreSQL), or for
// the write lock (SQLite), and the first waits for fn. It ends only when
// ctx does, and then says why: an Apply of the same ID was in flight in
// this process (the error said only "context deadline exceeded"). Nothing
// is recorded, and the ID is applied afterwards.
func TestNestedApplyOfTheSameIDEndsWithCtxAndSaysWhy(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		bg := context.Background()
		in, err := inbox.New(db, inbox.WithTable(dbtest.Table(t, db, "nest")))
		require.NoError(t, err)
		require.NoError(t, in.CreateSchema(bg))
		v, err := inbox.NewVersions(db, inbox.WithTable(dbtest.Table(t, db, "nestv")))
		require.NoError(t, err)
		require.NoError(t, v.CreateSchema(bg))
		noop := func(*sql.Tx) error { return nil }

		ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
		defer cancel()
		var inner error
		applied, err := in.Apply(ctx, "e1", func(*sql.Tx) error {
			_, inner = in.Apply(ctx, "e1", noop)
			return inner
		})
		require.False(t, applied)
		require.ErrorIs(t, inner, context.DeadlineExceeded)
		require.ErrorContains(t, inner, `an Apply of the event ID "e1" was in flight in this process`)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		seen, err := in.Seen(bg, "e1")
		require.NoError(t, err)
		require.False(t, seen, "nothing recorded")
		applied, err = in.Apply(bg, "e1", noop)
		require.NoError(t, err)
		require.True(t, applied)

		ctx, cancel = context.WithTimeout(bg, 300*time.Millisecond)
		defer cancel()
		applied, err = v.Apply(ctx, "a", 1, func(*sql.Tx) error {
			_, inner = v.Apply(ctx, "a", 2, noop)
			return inner
		})
		require.False(t, applied)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, inner, context.DeadlineExceeded)
		require.ErrorContains(t, inner, `an Apply of the entity "a" was in flight in this process`)
		_, ok, err := v.Current(bg, "a")
		require.NoError(t, err)
		require.False(t, ok, "nothing stored")

		if dbtest.Name(db) == "sqlite" {
			// The busy timeout (here 200 ms) before ctx ends.
			short, err := sqldb.OpenSQLite(filepath.Join(t.TempDir(), "busy.db") + "?_pragma=busy_timeout(200)")
			require.NoError(t, err)
			defer short.Close()
			in, err := inbox.New(short)
			require.NoError(t, err)
			require.NoError(t, in.CreateSchema(bg))
			applied, err := in.Apply(bg, "e1", func(*sql.Tx) error {
				_, inner = in.Apply(bg, "e1", noop)
				return inner
			})
			require.False(t, applied)
			require.Equal(t, sqldb.KindConflict, sqldb.Classify(err), "SQLITE_BUSY: %v", err)
			require.ErrorContains(t, inner, `an Apply of the event ID "e1" was in flight in this process`)
			require.ErrorContains(t, inner, "for the busy timeout")
		}

		// An Apply of another ID inside fn is not named so (on
		// PostgreSQL it runs; SQLite's one writer makes it wait too).
		ctx, cancel = context.WithTimeout(bg, 300*time.Millisecond)
		defer cancel()
		_, _ = in.Apply(ctx, "e2", func(*sql.Tx) error {
			_, inner = in.Apply(ctx, "e3", noop)
			return inner
		})
		if inner != nil {
			require.NotContains(t, inner.Error(), "in flight in this process")
		}
	})
}
