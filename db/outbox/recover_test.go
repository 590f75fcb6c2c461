package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// recoverFixture writes, per key k000..k003, rows 0..3 of type "a" (even)
// or "b" (odd), created an hour apart from base, and marks them dead with
// the error "boom <key> <j>" (row 3 of each key skipped instead).
func recoverFixture(t *testing.T, db *sql.DB) (*outbox.Outbox, time.Time) {
	t.Helper()
	ctx := context.Background()
	ob := newOutbox(t, db)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	// Keys written in reverse order: Recover's order is the key's, not
	// the outbox's.
	for k := 3; k >= 0; k-- {
		for j := range 4 {
			typ := "a"
			if j%2 == 1 {
				typ = "b"
			}
			_, err := ob.Write(ctx, tx, outbox.Event{ID: fmt.Sprintf("%s-%d", key(k), j), Key: key(k), Type: typ,
				Payload: []byte(strconv.Itoa(j)), CreatedAt: base.Add(time.Duration(j) * time.Hour)})
			require.NoError(t, err)
		}
	}
	require.NoError(t, tx.Commit())
	rows, err := db.QueryContext(ctx, `SELECT seq, key, payload FROM `+ob.Table())
	require.NoError(t, err)
	type row struct {
		seq int64
		key string
		j   string
	}
	var all []row
	for rows.Next() {
		var r row
		require.NoError(t, rows.Scan(&r.seq, &r.key, &r.j))
		all = append(all, r)
	}
	require.NoError(t, rows.Close())
	for _, r := range all {
		state := 2
		if r.j == "3" {
			state = 3
		}
		_, err := db.ExecContext(ctx, rebind(db, `UPDATE `+ob.Table()+` SET state = ?, attempts = 5, last_error = ? WHERE seq = ?`),
			state, "boom "+r.key+" "+r.j, r.seq)
		require.NoError(t, err)
	}
	return ob, base
}

func rebind(db *sql.DB, q string) string {
	if dbtest.Name(db) != "postgres" {
		return q
	}
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

func ids(rows []outbox.RecoveredRow) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

// Recover moves exactly the dead (and, when asked, skipped) rows its filter
// selects, in key order then outbox order, across batches (BatchSize 2: one
// transaction each), returning them as they were; Recoverable lists the same
// rows and moves nothing.
func TestRecoverMovesFilteredRowsInKeyOrder(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob, base := recoverFixture(t, db)

		f := outbox.RecoverFilter{Type: "a", BatchSize: 2}
		dry, err := ob.Recoverable(ctx, f)
		require.NoError(t, err)
		want := []string{"k000-0", "k000-2", "k001-0", "k001-2", "k002-0", "k002-2", "k003-0", "k003-2"}
		require.Equal(t, want, ids(dry))
		require.EqualValues(t, 12, counts(t, ob)[outbox.Dead], "the dry run moved nothing")
		require.Equal(t, outbox.Dead, dry[0].State)
		require.Equal(t, "boom k000 0", dry[0].Err)
		require.Equal(t, 5, dry[0].Attempts)
		require.True(t, dry[0].CreatedAt.Equal(base), "created %v", dry[0].CreatedAt)

		moved, err := ob.Recover(ctx, f)
		require.NoError(t, err)
		require.Equal(t, want, ids(moved))
		c := counts(t, ob)
		require.EqualValues(t, 8, c[outbox.Pending])
		require.EqualValues(t, 4, c[outbox.Dead])
		again, err := ob.Recover(ctx, f)
		require.NoError(t, err)
		require.Empty(t, again, "nothing left to move")

		// Key, created range, error text, skipped rows, limit.
		moved, err = ob.Recover(ctx, outbox.RecoverFilter{Keys: []string{key(2), key(1)}, CreatedFrom: base.Add(time.Hour), CreatedTo: base.Add(2 * time.Hour)})
		require.NoError(t, err)
		require.Equal(t, []string{"k001-1", "k002-1"}, ids(moved))
		moved, err = ob.Recover(ctx, outbox.RecoverFilter{ErrorContains: "boom k003"})
		require.NoError(t, err)
		require.Equal(t, []string{"k003-1"}, ids(moved), "dead rows only by default")
		moved, err = ob.Recover(ctx, outbox.RecoverFilter{States: []outbox.State{outbox.Skipped}, Limit: 3, BatchSize: 1})
		require.NoError(t, err)
		require.Equal(t, []string{"k000-3", "k001-3", "k002-3"}, ids(moved))
		require.Equal(t, outbox.Skipped, moved[0].State)
		moved, err = ob.Recover(ctx, outbox.RecoverFilter{States: []outbox.State{outbox.Dead, outbox.Skipped}, IDs: []string{"k003-3", "k000-1", "k000-0"}})
		require.NoError(t, err)
		require.Equal(t, []string{"k000-1", "k003-3"}, ids(moved), "k000-0 is pending already")
		c = counts(t, ob)
		require.EqualValues(t, 16, c[outbox.Pending])
		require.Zero(t, c[outbox.Dead]+c[outbox.Skipped])
		var attempts int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT attempts FROM `+ob.Table()+` WHERE id = 'k000-1'`).Scan(&attempts))
		require.Equal(t, 5, attempts, "attempts kept, as Resume keeps them")
	})
}

// A filter Recover cannot honour is refused before any SQL, naming what is
// wrong; nothing moves.
func TestRecoverRefusesBadFilters(t *testing.T) {
	ctx := context.Background()
	ob, base := recoverFixture(t, dbtest.SQLite(t))
	for name, f := range map[string]outbox.RecoverFilter{
		"pending state": {States: []outbox.State{outbox.Pending}},
		"state twice":   {States: []outbox.State{outbox.Dead, outbox.Dead}},
		"range":         {CreatedFrom: base.Add(time.Hour), CreatedTo: base},
		"now range":     {CreatedFrom: time.Now().Add(time.Hour), CreatedTo: time.Now()},
		"died range":    {DiedFrom: base.Add(time.Hour), DiedTo: base},
		"limit":         {Limit: -1},
		"batch":         {BatchSize: outbox.MaxRecoverBatch + 1},
		"empty ID":      {IDs: []string{""}},
		"NUL in an ID":  {IDs: []string{"a\x00"}},
		"NUL in type":   {Type: "a\x00"},
		"too many keys": {Keys: make([]string, outbox.MaxRecoverList+1)},
		// Found by attacking the code: a far bound overflowed the
		// stored times (SQLite's microseconds, PostgreSQL's range): a
		// "max time" upper bound or a far lower bound selected nothing
		// (year 300000: PostgreSQL's "timestamp out of range").
		"max time":       {CreatedTo: time.Unix(1<<63-62135596801, 999999999)},
		"far died bound": {DiedTo: time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"far lower":      {CreatedFrom: time.Date(-300000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		_, err := ob.Recover(ctx, f)
		require.ErrorIs(t, err, outbox.ErrInvalidFilter, name)
		// The message is readable: no fmt verb error (an empty ID once
		// read "ID \"\": %!w(<nil>)"), no monotonic clock reading (a
		// time.Now bound once printed "m=+3.077517458").
		require.NotContains(t, err.Error(), "%!", name)
		require.NotContains(t, err.Error(), "m=+", name)
		_, err = ob.Recoverable(ctx, f)
		require.ErrorIs(t, err, outbox.ErrInvalidFilter, name)
	}
	_, err := ob.Recover(ctx, outbox.RecoverFilter{Keys: []string{""}})
	require.ErrorIs(t, err, outbox.ErrInvalidKey)
	var nilCtx context.Context
	_, err = ob.Recover(nilCtx, outbox.RecoverFilter{})
	require.ErrorIs(t, err, outbox.ErrNilContext)
	_, err = (*outbox.Outbox)(nil).Recover(ctx, outbox.RecoverFilter{})
	require.ErrorIs(t, err, outbox.ErrZeroOutbox)
	require.EqualValues(t, 12, counts(t, ob)[outbox.Dead])
}

// Under Park, a relay whose sink rejects row 2 of every key parks all keys;
// fixing the sink and recovering the dead heads by error text resumes every
// key: each delivers its rows in order, the recovered head first.
func TestRecoverResumesParkedKeys(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		const keys, perKey = 6, 5
		writeEvents(t, ob, keys, perKey, 30)
		var broken atomic.Bool
		broken.Store(true)
		rec := newRecorder(keys * perKey)
		died := make(chan outbox.DeadEvent, keys)
		r, _ := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
			if string(e.Payload) == "2" && broken.Load() {
				return keysched.Permanent(errors.New("schema mismatch"))
			}
			return rec.sink(ctx, e)
		}, outbox.WithLogger(quiet), outbox.WithFailurePolicy(keysched.Park), outbox.WithPollInterval(5*time.Millisecond),
			outbox.WithRetry(fastRetry), outbox.WithOnDead(func(d outbox.DeadEvent) { died <- d }))
		for range keys {
			select {
			case <-died:
			case <-time.After(20 * time.Second):
				t.Fatal("keys did not park")
			}
		}
		parked, err := r.Parked(ctx)
		require.NoError(t, err)
		require.Len(t, parked, keys)
		time.Sleep(50 * time.Millisecond) // a parked key must not go on meanwhile
		rec.mu.Lock()
		for k, seq := range rec.byKey {
			require.Equal(t, []int{0, 1}, seq, "key %s went past its dead head", k)
		}
		rec.mu.Unlock()

		broken.Store(false)
		moved, err := r.Recover(ctx, outbox.RecoverFilter{ErrorContains: "schema mismatch", BatchSize: 4})
		require.NoError(t, err)
		require.Len(t, moved, keys)
		for i, m := range moved {
			require.Equal(t, key(i), m.Key, "key order")
		}
		rec.wait(t, 20*time.Second)
		rec.mu.Lock()
		defer rec.mu.Unlock()
		checkStreams(t, rec.byKey, keys, perKey)
		require.Zero(t, rec.overlaps.Load())
	})
}

// Concurrent Recovers and Resumes over the same dead rows each report only
// the rows they moved: together every row exactly once (on PostgreSQL the
// batch's FOR UPDATE makes a Recover that waited for another's lock skip the
// rows that are no longer dead).
func TestRecoverRacingResumeMovesEachRowOnce(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		const keys = 20
		writeEvents(t, ob, keys, 3, 60)
		_, err := db.ExecContext(ctx, `UPDATE `+ob.Table()+` SET state = 2`)
		require.NoError(t, err)
		var mu sync.Mutex
		seen := map[string]int{}
		resumed := 0
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				moved, err := ob.Recover(ctx, outbox.RecoverFilter{BatchSize: 7})
				require.NoError(t, err)
				mu.Lock()
				for _, m := range moved {
					seen[m.ID]++
				}
				mu.Unlock()
			})
		}
		wg.Go(func() {
			for k := range keys {
				for ob.Resume(ctx, key(k)) == nil {
					mu.Lock()
					resumed++
					mu.Unlock()
				}
			}
		})
		wg.Wait()
		for id, n := range seen {
			require.Equal(t, 1, n, "%s reported moved %d times", id, n)
		}
		require.Equal(t, keys*3, len(seen)+resumed, "every row moved once")
		require.EqualValues(t, keys*3, counts(t, ob)[outbox.Pending])
	})
}
