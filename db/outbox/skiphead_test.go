package outbox_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// SkipHead names the row it moved, and only that one: with 8 dead rows of
// one key (a Continue policy leaves several) and 8 concurrent SkipHead
// calls, each names a different row, together all 8, oldest first for a
// single caller; the 9th is ErrNotParked. (Added with SkipHead: a caller
// that read the head, then called Skip, could name another row than the one
// skipped; the webhook service did, and its backlog drifted.) On PostgreSQL
// the concurrent calls found a bug of Skip and Resume themselves: two moves
// at once picked the same head, and the one that waited for the other's lock
// moved nothing and reported ErrNotParked for a key that still had dead rows
// (5 of 8 calls here); a move of nothing is now retried while a dead row is
// left.
func TestSkipHeadNamesTheMovedRow(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, 10, 10)
		var ids []string
		rows, err := db.QueryContext(ctx, `SELECT id FROM `+ob.Table()+` ORDER BY seq`)
		require.NoError(t, err)
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			ids = append(ids, id)
		}
		require.NoError(t, rows.Close())
		_, err = db.ExecContext(ctx, `UPDATE `+ob.Table()+` SET state = 2`)
		require.NoError(t, err)

		id, err := ob.SkipHead(ctx, key(0))
		require.NoError(t, err)
		require.Equal(t, ids[0], id, "the oldest dead row")
		require.NoError(t, ob.Skip(ctx, key(0)))

		got := make(chan string, 8)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				id, err := ob.SkipHead(ctx, key(0))
				require.NoError(t, err)
				got <- id
			})
		}
		wg.Wait()
		close(got)
		seen := map[string]bool{}
		for id := range got {
			require.False(t, seen[id], "two calls named %s", id)
			seen[id] = true
		}
		for _, id := range ids[2:] {
			require.True(t, seen[id], "%s skipped and named", id)
		}
		_, err = ob.SkipHead(ctx, key(0))
		require.ErrorIs(t, err, outbox.ErrNotParked)
		require.EqualValues(t, 10, counts(t, ob)[outbox.Skipped])
		var nilCtx context.Context
		_, err = ob.SkipHead(nilCtx, key(0))
		require.Error(t, err)
	})
}
