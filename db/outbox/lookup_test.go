package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// writeIDs writes one event per (id, key) pair, in order, in one
// transaction.
func writeIDs(t *testing.T, ob *outbox.Outbox, pairs ...string) {
	t.Helper()
	ctx := context.Background()
	tx, err := ob.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	for i := 0; i < len(pairs); i += 2 {
		_, err := ob.Write(ctx, tx, outbox.Event{ID: pairs[i], Key: pairs[i+1], Type: "t", Payload: []byte("0")})
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
}

// Lookup reports each state with the row's key, type, seq, attempts, last
// error and times, and for a pending row the pending and dead rows of its
// key before it; an ID no row has is ErrNotFound. The states are set with
// SQL as the relay leaves them (state, attempts, last_error, done_at).
func TestLookupReportsEachState(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		writeIDs(t, ob, "a", "k", "b", "k", "c", "k", "d", "k", "e", "j")
		done := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		doneArg := any(done.UnixMicro())
		if dbtest.Name(db) == "postgres" {
			doneArg = done
		}
		set := func(id string, state outbox.State, attempts int, lastErr string) {
			_, err := db.ExecContext(ctx, rebind(db, `UPDATE `+ob.Table()+` SET state = ?, attempts = ?, last_error = ?, done_at = ? WHERE id = ?`),
				int(state), attempts, lastErr, doneArg, id)
			require.NoError(t, err)
		}
		set("a", outbox.Sent, 0, "")
		set("b", outbox.Dead, 3, "boom")

		look := func(id string) outbox.EventStatus {
			t.Helper()
			s, err := ob.Lookup(ctx, id)
			require.NoError(t, err, id)
			require.Equal(t, id, s.ID)
			require.Equal(t, "t", s.Type)
			require.False(t, s.CreatedAt.IsZero())
			return s
		}
		a, b, c, d, e := look("a"), look("b"), look("c"), look("d"), look("e")
		require.True(t, a.Seq < b.Seq && b.Seq < c.Seq && c.Seq < d.Seq && d.Seq < e.Seq, "seqs in write order")

		require.Equal(t, outbox.Sent, a.State)
		require.Equal(t, "k", a.Key)
		require.Equal(t, done, a.DoneAt)
		require.Zero(t, a.Ahead+a.DeadAhead, "counts are for pending rows only")

		require.Equal(t, outbox.Dead, b.State)
		require.Equal(t, 3, b.Attempts)
		require.Equal(t, "boom", b.Err)
		require.Equal(t, done, b.DoneAt)

		require.Equal(t, outbox.Pending, c.State)
		require.True(t, c.DoneAt.IsZero())
		require.EqualValues(t, 0, c.Ahead, "c: no pending row of k before it")
		require.EqualValues(t, 1, c.DeadAhead, "c: b, dead, before it")
		require.EqualValues(t, 1, d.Ahead, "d: c before it")
		require.EqualValues(t, 1, d.DeadAhead)
		require.Equal(t, "j", e.Key)
		require.Zero(t, e.Ahead+e.DeadAhead, "another key's rows are not ahead")

		require.NoError(t, ob.Skip(ctx, "k"))
		b = look("b")
		require.Equal(t, outbox.Skipped, b.State)
		require.Equal(t, "boom", b.Err, "a skipped row keeps its error")
		require.Zero(t, look("d").DeadAhead, "the skipped row no longer holds the key")

		_, err := ob.Lookup(ctx, "never-written")
		require.ErrorIs(t, err, outbox.ErrNotFound)
		require.ErrorContains(t, err, `"never-written"`)
	})
}

// With the default retention a published row is deleted: Lookup then says
// ErrNotFound; a relay made WithRetention keeps it, and Lookup says Sent
// with its send time. A row the sink refuses for good is Dead with the
// attempts and the error the relay recorded. Real relays, not SQL.
func TestLookupFollowsTheRelay(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		writeIDs(t, ob, "ok", "k1", "bad", "k2")
		sink := func(ctx context.Context, e outbox.Event) error {
			if e.ID == "bad" {
				return keysched.Permanent(errors.New("rejected by the broker"))
			}
			return nil
		}
		_, stop := startRelay(t, ob, sink, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond))
		waitUntil(t, "ok published and deleted, bad dead", func() bool {
			_, err := ob.Lookup(ctx, "ok")
			s, _ := ob.Lookup(ctx, "bad")
			return errors.Is(err, outbox.ErrNotFound) && s.State == outbox.Dead
		})
		stop()
		s, err := ob.Lookup(ctx, "bad")
		require.NoError(t, err)
		require.Equal(t, 1, s.Attempts, "a permanent error is not retried")
		require.Contains(t, s.Err, "rejected by the broker")
		require.False(t, s.DoneAt.IsZero())

		writeIDs(t, ob, "kept", "k3")
		before := time.Now().Add(-time.Minute)
		_, stop = startRelay(t, ob, sink, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond), outbox.WithRetention(time.Hour))
		waitUntil(t, "kept published", func() bool {
			s, _ := ob.Lookup(ctx, "kept")
			return s.State == outbox.Sent
		})
		stop()
		s, err = ob.Lookup(ctx, "kept")
		require.NoError(t, err)
		require.True(t, s.DoneAt.After(before), "DoneAt %v is the send time", s.DoneAt)
		require.Equal(t, "k3", s.Key)
	})
}

// Bad input is refused before any SQL, with a clear error; a missing table
// is ErrNoSchema.
func TestLookupRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	db := dbtest.SQLite(t)
	ob := newOutbox(t, db)
	for id, want := range map[string]string{
		"":                                     "empty ID",
		"a\x00b":                               "NUL",
		"\xff":                                 "invalid UTF-8",
		strings.Repeat("x", outbox.MaxIDLen+1): "bytes",
	} {
		st, err := ob.Lookup(ctx, id)
		require.ErrorIs(t, err, outbox.ErrInvalidID, "%q", id)
		require.ErrorContains(t, err, want, "%q", id)
		require.Zero(t, st, "with an error, the zero EventStatus")
	}
	var nilCtx context.Context
	_, err := ob.Lookup(nilCtx, "x")
	require.ErrorIs(t, err, outbox.ErrNilContext)
	_, err = (*outbox.Outbox)(nil).Lookup(ctx, "x")
	require.ErrorIs(t, err, outbox.ErrZeroOutbox)
	_, err = (&outbox.Outbox{}).Lookup(ctx, "x")
	require.ErrorIs(t, err, outbox.ErrZeroOutbox)

	noTable, err := outbox.New(db, outbox.WithTable("no_such_outbox"))
	require.NoError(t, err)
	st, err := noTable.Lookup(ctx, "x")
	require.ErrorIs(t, err, outbox.ErrNoSchema)
	require.Zero(t, st, "with an error, the zero EventStatus")
	st, err = ob.Lookup(ctx, "never-written")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	require.Zero(t, st, "with an error, the zero EventStatus")
}
