package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// Write's limits are the exported constants; each refusal is ErrInvalidEvent
// naming the field, returned before any SQL: the same transaction (also on
// PostgreSQL) then takes a valid event and commits. An ID of MaxIDLen bytes
// is a valid inbox ID downstream.
func TestEventLimits(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		long := func(n int) string { return strings.Repeat("a", n) }
		bad := []struct {
			e     outbox.Event
			field string
		}{
			{outbox.Event{Key: ""}, "empty key"},
			{outbox.Event{Key: "k", ID: long(outbox.MaxIDLen + 1)}, fmt.Sprintf("ID of %d bytes (at most %d)", outbox.MaxIDLen+1, outbox.MaxIDLen)},
			{outbox.Event{Key: long(outbox.MaxKeyLen + 1)}, fmt.Sprintf("key of %d bytes (at most %d)", outbox.MaxKeyLen+1, outbox.MaxKeyLen)},
			{outbox.Event{Key: "k", Type: long(outbox.MaxTypeLen + 1)}, fmt.Sprintf("type of %d bytes (at most %d)", outbox.MaxTypeLen+1, outbox.MaxTypeLen)},
			{outbox.Event{Key: "k", ID: "i\x00d"}, `ID "i\x00d": NUL byte`},
			{outbox.Event{Key: "k\x00"}, `key "k\x00": NUL byte`},
			{outbox.Event{Key: "k", Type: "t\x00"}, `type "t\x00": NUL byte`},
			{outbox.Event{Key: "k", ID: "id\xfe"}, `ID "id\xfe": invalid UTF-8`},
			{outbox.Event{Key: "k\xff"}, `key "k\xff": invalid UTF-8`},
			{outbox.Event{Key: "k", Type: "t\xc3"}, `type "t\xc3": invalid UTF-8`},
			{outbox.Event{Key: "k", Headers: map[string]string{"trace": "x\xffy"}}, `header "trace": invalid UTF-8`},
			{outbox.Event{Key: "k", Headers: map[string]string{"tr\xffce": "x"}}, `header name "tr\xffce": invalid UTF-8`},
		}
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback()
		for _, b := range bad {
			_, err := ob.Write(ctx, tx, b.e)
			require.ErrorIs(t, err, outbox.ErrInvalidEvent, "%+q", b.e)
			require.ErrorContains(t, err, b.field)
		}
		_, err = ob.Write(nil, tx, outbox.Event{Key: "k"}) //nolint:staticcheck // a nil ctx on purpose
		require.ErrorIs(t, err, outbox.ErrNilContext)
		// The refusals left tx untouched: it takes events at the limits.
		id := long(outbox.MaxIDLen)
		_, err = ob.Write(ctx, tx, outbox.Event{ID: id, Key: long(outbox.MaxKeyLen), Type: long(outbox.MaxTypeLen)})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		require.Equal(t, map[outbox.State]int64{outbox.Pending: 1}, counts(t, ob))

		require.LessOrEqual(t, outbox.MaxIDLen, inbox.MaxIDLen)
		in, err := inbox.New(db, inbox.WithTable(dbtest.Table(t, db, "ib")))
		require.NoError(t, err)
		require.NoError(t, in.CreateSchema(ctx))
		applied, err := in.Apply(ctx, id, func(*sql.Tx) error { return nil })
		require.NoError(t, err)
		require.True(t, applied, "an outbox ID of MaxIDLen bytes is a valid inbox ID")
	})
}

// Headers are text and come back unchanged (NUL and non-ASCII included);
// invalid UTF-8 is refused (above) instead of arriving as U+FFFD.
func TestHeadersRoundTrip(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		want := map[string]string{"nul": "x\x00y", "utf8": "é€😀", "quote": `"\`, "": "empty name"}
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = ob.Write(ctx, tx, outbox.Event{Key: "k", Headers: want})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		got := make(chan map[string]string, 1)
		_, stop := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
			got <- e.Headers
			return nil
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond))
		select {
		case h := <-got:
			require.Equal(t, want, h)
		case <-time.After(30 * time.Second):
			t.Fatal("not published")
		}
		stop()
	})
}

// On a database opened with sqldb.OpenSQLite (busy timeout, WAL, immediate
// transactions), 8 goroutines writing events concurrently, each Write its
// own transaction, while a relay claims, fetches and marks: every Write
// succeeds (a plain sql.Open("sqlite", path) failed nearly all with
// SQLITE_BUSY) and every event is published.
func TestConcurrentWritersOnOpenSQLite(t *testing.T) {
	ctx := context.Background()
	db := dbtest.SQLite(t) // sqldb.OpenSQLite
	ob := newOutbox(t, db)
	const writers, each = 8, 100
	rec := newRecorder(writers * each)
	_, stop := startRelay(t, ob, rec.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(time.Millisecond))
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for j := range each {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					errs <- err
					continue
				}
				_, err = ob.Write(ctx, tx, outbox.Event{Key: key(w), Payload: []byte(strconv.Itoa(j))})
				if err == nil {
					err = tx.Commit()
				} else {
					tx.Rollback()
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	var failed []error
	for err := range errs {
		failed = append(failed, err)
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d writes failed, the first with: %v", len(failed), writers*each, failed[0])
	}
	rec.wait(t, 60*time.Second)
	stop()
	require.Zero(t, rec.check(t, writers, each))
}

// Invalid UTF-8 in an event's key, ID or type is ErrInvalidEvent on both
// databases: before, SQLite stored it and PostgreSQL failed the Write (and
// aborted the caller's transaction) with a database error.
func TestWriteInvalidUTF8(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		for _, e := range []outbox.Event{{Key: "k\xff"}, {Key: "k", ID: "id\xfe"}, {Key: "k", Type: "t\xc3"}} {
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = ob.Write(ctx, tx, e)
			require.ErrorIs(t, err, outbox.ErrInvalidEvent, "%+v", e)
			require.NoError(t, tx.Rollback())
		}
	})
}

// Write before CreateSchema (the first call most programs make) fails with
// an error wrapping ErrNoSchema, which says to run CreateSchema and names
// the table, with the database's error; the transaction's state is the
// database's (PostgreSQL aborts it).
func TestWriteBeforeCreateSchemaSaysSo(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		table := dbtest.Table(t, db, "nosch")
		ob, err := outbox.New(db, outbox.WithTable(table))
		require.NoError(t, err)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback()
		_, err = ob.Write(ctx, tx, outbox.Event{Key: "k", Payload: []byte("x")})
		require.ErrorIs(t, err, outbox.ErrNoSchema)
		require.ErrorContains(t, err, "run CreateSchema")
		require.ErrorContains(t, err, table)
		require.NotErrorIs(t, err, outbox.ErrDuplicateID)
		t.Log(err)
	})
}

// On a caller's own in-memory SQLite database (sql.Open("sqlite",
// ":memory:"): sqldb.OpenSQLite refuses it), each pooled connection has its
// own database: CreateSchema succeeds on one, and a Write on another finds
// no table. Its error must not claim that CreateSchema was not run: it says
// the table is missing on this connection and why that happens. Before, it
// read "table missing: run CreateSchema" only.
func TestWriteOnAnotherInMemoryConnectionSaysWhy(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", ":memory:")
	require.NoError(t, err)
	defer db.Close()
	ob, err := outbox.New(db)
	require.NoError(t, err)
	require.NoError(t, ob.CreateSchema(ctx))
	held, err := db.Conn(ctx) // the connection that has the schema
	require.NoError(t, err)
	defer held.Close()
	tx, err := db.BeginTx(ctx, nil) // a new connection: a new, empty database
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = ob.Write(ctx, tx, outbox.Event{Key: "k"})
	require.ErrorIs(t, err, outbox.ErrNoSchema)
	require.ErrorContains(t, err, "on this connection")
	require.ErrorContains(t, err, "in-memory SQLite database is per connection")
}
