package inbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
)

// Seen and Current refuse an ID (entity) no event can have with ErrInvalidID
// on both databases, as Apply does: PostgreSQL answered a NUL byte or
// invalid UTF-8 with a database error, SQLite with "not recorded".
func TestLookupOfAnInvalidIDIsErrInvalidID(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		in, _ := setup(t, db)
		v, err := inbox.NewVersions(db, inbox.WithTable(dbtest.Table(t, db, "ver")))
		require.NoError(t, err)
		require.NoError(t, v.CreateSchema(ctx))
		for _, id := range []string{"", "a\x00b", "a\xffb"} {
			seen, err := in.Seen(ctx, id)
			require.ErrorIs(t, err, inbox.ErrInvalidID, "Seen(%q)", id)
			require.False(t, seen)
			_, ok, err := v.Current(ctx, id)
			require.ErrorIs(t, err, inbox.ErrInvalidID, "Current(%q)", id)
			require.False(t, ok)
		}
	})
}
