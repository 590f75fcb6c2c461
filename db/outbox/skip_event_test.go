package outbox_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// headIDs returns the IDs of key's rows, oldest first.
func headIDs(t *testing.T, ob *outbox.Outbox, k string) []string {
	t.Helper()
	rows, err := ob.DB().QueryContext(context.Background(), sqldb.Rebind(ob.Dialect(), `SELECT id FROM `+ob.Table()+` WHERE key = ? ORDER BY seq`), k)
	require.NoError(t, err)
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	return ids
}

// SkipEvent gives up the key's dead head only if it is the event the
// operator saw. The stale view: the operator looks at the parked key (head
// e0), meanwhile e0 is resumed and published and e1 dies; Skip (and
// SkipHead) would give up e1, an event the operator never saw. SkipEvent
// refuses with ErrHeadChanged naming e1, and moves nothing.
func TestSkipEventGivesUpOnlyTheHeadSeen(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, 3, 10)
		ids := headIDs(t, ob, key(0))
		set := func(id string, s outbox.State) {
			t.Helper()
			_, err := db.ExecContext(ctx, sqldb.Rebind(ob.Dialect(), `UPDATE `+ob.Table()+` SET state = ? WHERE id = ?`), int(s), id)
			require.NoError(t, err)
		}
		state := func(id string) outbox.State {
			t.Helper()
			st, err := ob.Lookup(ctx, id)
			require.NoError(t, err)
			return st.State
		}
		set(ids[0], outbox.Dead)
		seen := ids[0] // what the operator's page shows

		// Not the head: refused, nothing moved.
		err := ob.SkipEvent(ctx, key(0), ids[1])
		require.ErrorIs(t, err, outbox.ErrHeadChanged)
		require.Contains(t, err.Error(), ids[0], "names the current head")

		// The head seen resumed, published; the next event dies.
		require.NoError(t, ob.Resume(ctx, key(0)))
		set(ids[0], outbox.Sent)
		set(ids[1], outbox.Dead)
		err = ob.SkipEvent(ctx, key(0), seen)
		require.ErrorIs(t, err, outbox.ErrHeadChanged)
		require.NotErrorIs(t, err, outbox.ErrNotParked)
		require.Contains(t, err.Error(), ids[1], "names the current head")
		var hc *outbox.HeadChangedError
		require.ErrorAs(t, err, &hc)
		require.Equal(t, outbox.HeadChangedError{Key: key(0), ID: seen, Head: ids[1]}, *hc)
		require.Equal(t, outbox.Dead, state(ids[1]), "the event not seen is not given up")
		require.Equal(t, outbox.Sent, state(ids[0]))

		// The head seen now: given up, the key goes on.
		require.NoError(t, ob.SkipEvent(ctx, key(0), ids[1]))
		require.Equal(t, outbox.Skipped, state(ids[1]))
		require.ErrorIs(t, ob.SkipEvent(ctx, key(0), ids[1]), outbox.ErrNotParked, "a second click")
		require.Equal(t, outbox.Pending, state(ids[2]))

		// An ID no event can have: refused before any SQL; never read
		// as "whatever the head is".
		set(ids[2], outbox.Dead)
		for _, id := range []string{"", "x\x00", "x\xff", strings.Repeat("x", outbox.MaxIDLen+1)} {
			require.ErrorIs(t, ob.SkipEvent(ctx, key(0), id), outbox.ErrInvalidID, "%q", id)
		}
		require.ErrorIs(t, ob.SkipEvent(ctx, "", ids[2]), outbox.ErrInvalidKey)
		require.Equal(t, outbox.Dead, state(ids[2]))
		var nilCtx context.Context
		require.ErrorIs(t, ob.SkipEvent(nilCtx, key(0), ids[2]), outbox.ErrNilContext)

		// The relay's: the same, and refused after Close.
		r, err := ob.NewRelay(func(context.Context, outbox.Event) error { return nil }, outbox.WithLogger(quiet))
		require.NoError(t, err)
		require.ErrorIs(t, r.SkipEvent(ctx, key(0), ids[1]), outbox.ErrHeadChanged)
		require.NoError(t, r.SkipEvent(ctx, key(0), ids[2]))
		require.Equal(t, outbox.Skipped, state(ids[2]))
		require.NoError(t, r.Close(ctx))
		require.ErrorIs(t, r.SkipEvent(ctx, key(0), ids[2]), outbox.ErrClosed)
	})
}

// Concurrent SkipEvent calls for one head (two operators, a double click):
// one gives it up, every other one is refused (ErrHeadChanged: the head is
// now the next dead row) and gives up nothing. With Skip's statement (the
// oldest dead row, whatever it is) the 8 calls gave up all 3 dead rows and
// more calls succeeded than the one head seen.
func TestSkipEventConcurrentCallsGiveUpOneHead(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, 3, 10)
		ids := headIDs(t, ob, key(0))
		_, err := db.ExecContext(ctx, `UPDATE `+ob.Table()+` SET state = 2`)
		require.NoError(t, err)
		errs := make(chan error, 8)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { errs <- ob.SkipEvent(ctx, key(0), ids[0]) })
		}
		wg.Wait()
		close(errs)
		won := 0
		for err := range errs {
			if err == nil {
				won++
				continue
			}
			require.ErrorIs(t, err, outbox.ErrHeadChanged)
			require.Contains(t, err.Error(), ids[1])
		}
		require.Equal(t, 1, won)
		require.EqualValues(t, 1, counts(t, ob)[outbox.Skipped])
		require.EqualValues(t, 2, counts(t, ob)[outbox.Dead])
	})
}
