package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// leaseSlack is how much earlier than the test's reference a lease's expiry
// may be: the database's clock (SQLite's in millisecond steps, rounded up)
// against the test's, the same machine's wall clock.
const leaseSlack = 10 * time.Millisecond

// A claim that waits for a lock (another connection's write transaction on
// SQLite, BEGIN IMMEDIATE; a LOCK TABLE of the lease table on PostgreSQL)
// writes a lease that runs a full lease duration from when it got the lock,
// not from when it was sent: every lease row a claim wrote (recorded by a
// trigger, before any renewal) expires at least a lease after the moment
// the lock was released. One key has an expired lease of another relay,
// which the claim takes over (on SQLite the upsert's update, by the same
// clock). The lock is held 300 ms, longer than the 200 ms lease: before,
// the claims wrote leases already expired (100 ms before the release). The
// relay then publishes every row, in order, exactly once.
func TestClaimWaitingForALockWritesAFullLease(t *testing.T) {
	const keys, perKey = 3, 4
	const lease, hold = 200 * time.Millisecond, 300 * time.Millisecond
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob, d, l := leaseWaitOutbox(t, db)
		writeEvents(t, ob, keys, perKey, keys)
		if d == sqldb.Postgres {
			_, err := db.Exec(`INSERT INTO `+l+` (key, owner, expires_at, token, epoch) VALUES ($1, 'gone', now() - interval '1 second', 'gone', 0)`, key(0))
			require.NoError(t, err)
		} else {
			_, err := db.Exec(`INSERT INTO `+l+` (key, owner, expires_at, token, epoch) VALUES (?, 'gone', ?, 'gone', 0)`, key(0), time.Now().Add(-time.Second).UnixMicro())
			require.NoError(t, err)
		}
		before := len(readLeaseWrites(t, db, d, l, 0))

		lock := lockLeases(t, db, d, l, false)
		rec := newRecorder(keys * perKey)
		r, err := ob.NewRelay(rec.sink, outbox.WithLeaseDuration(lease), outbox.WithListen(false), outbox.WithLogger(quiet))
		require.NoError(t, err)
		walked := make(chan struct{})
		var once sync.Once
		outbox.OnWalk(r, func(found []string) {
			if len(found) > 0 {
				once.Do(func() { close(walked) })
			}
		})
		stop := runRelay(t, r)
		select {
		case <-walked: // the claim is about to be sent: it waits for the lock
		case <-time.After(10 * time.Second):
			t.Fatal("the relay found no key to claim")
		}
		time.Sleep(hold)
		released := time.Now() // the lock is released after this
		require.NoError(t, lock.Commit())

		rec.wait(t, 10*time.Second)
		stop()
		require.Zero(t, rec.check(t, keys, perKey), "duplicates")
		require.Zero(t, counts(t, ob)[outbox.Pending], "pending rows")
		t.Logf("stats %+v", r.Stats())

		claims := readLeaseWrites(t, db, d, l, before)
		require.GreaterOrEqual(t, len(claims), keys, "every key claimed")
		checkLeaseWrites(t, claims, released, lease)
	})
}

// A renewal that waits for a lock writes a lease that runs a full lease
// duration from when it got the lock: the relay holds a key (its sink call
// waits), the lease table is locked for 200 ms (a third of the 600 ms lease)
// and a renewal is started at once; every lease row written after the lock
// was taken (the waiting renewal, and the renewer's) expires at least a
// lease after the lock was released. Before, the waiting renewal wrote a
// lease 200 ms short. The relay keeps the key through the wait and publishes
// every row, in order, exactly once. On PostgreSQL also with the key's lease
// row locked (FOR SHARE, as a mark locks it) rather than the table: the
// renewal waits in its FOR UPDATE, while it runs, after
// statement_timestamp() (which would pass the table lock, taken at bind in
// pgx's exec mode).
func TestRenewalWaitingForALockWritesAFullLease(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) { renewalWaitingForALock(t, db, false) })
	t.Run("postgres_row_lock", func(t *testing.T) { renewalWaitingForALock(t, dbtest.Postgres(t), true) })
}

func renewalWaitingForALock(t *testing.T, db *sql.DB, rowLock bool) {
	t.Helper()
	const perKey = 3
	const lease, hold = 600 * time.Millisecond, 200 * time.Millisecond
	ob, d, l := leaseWaitOutbox(t, db)
	writeEvents(t, ob, 1, perKey, perKey)

	rec := newRecorder(perKey)
	called, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	sink := func(ctx context.Context, e outbox.Event) error {
		once.Do(func() { close(called) })
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		return rec.sink(ctx, e)
	}
	r, err := ob.NewRelay(sink, outbox.WithLeaseDuration(lease), outbox.WithListen(false), outbox.WithLogger(quiet))
	require.NoError(t, err)
	stop := runRelay(t, r)
	select {
	case <-called: // the key is held
	case <-time.After(10 * time.Second):
		t.Fatal("the relay published nothing")
	}
	before := len(readLeaseWrites(t, db, d, l, 0))
	lock := lockLeases(t, db, d, l, rowLock)
	renewed := make(chan struct{})
	go func() { outbox.Renew(r); close(renewed) }() // waits for the lock
	time.Sleep(hold)
	released := time.Now() // the lock is released after this
	require.NoError(t, lock.Commit())
	<-renewed
	close(gate)

	rec.wait(t, 10*time.Second)
	stop()
	require.Zero(t, rec.check(t, 1, perKey), "duplicates")
	require.Zero(t, counts(t, ob)[outbox.Pending], "pending rows")
	st := r.Stats()
	t.Logf("stats %+v", st)
	require.Zero(t, st.LeasesLost, "the key was kept through the wait")

	writes := readLeaseWrites(t, db, d, l, before)
	require.NotEmpty(t, writes, "the renewal")
	checkLeaseWrites(t, writes, released, lease)
}

// leaseWaitOutbox makes an outbox on a fresh table of db with triggers that
// record every lease write (recordLeaseWrites). On PostgreSQL it returns
// an outbox of the same table on connections in pgx's exec mode (parse,
// bind and execute in one round trip), so that a statement waits for a
// table lock within its own transaction, as a cached statement (pgx's
// default) does at its bind; a statement's first execution in the default
// mode would wait in the prepare, a round trip of its own before its
// transaction begins.
func leaseWaitOutbox(t *testing.T, db *sql.DB) (*outbox.Outbox, sqldb.Dialect, string) {
	t.Helper()
	ob := newOutbox(t, db)
	l := ob.Table() + "_lease"
	d, err := sqldb.Detect(db)
	require.NoError(t, err)
	recordLeaseWrites(t, db, d, l)
	if d != sqldb.Postgres {
		return ob, d, l
	}
	dsn := dbtest.DSN()
	switch {
	case !strings.Contains(dsn, "://"):
		dsn += " default_query_exec_mode=exec"
	case strings.Contains(dsn, "?"):
		dsn += "&default_query_exec_mode=exec"
	default:
		dsn += "?default_query_exec_mode=exec"
	}
	execDB, err := sqldb.OpenPostgres(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { execDB.Close() })
	ob, err = outbox.New(execDB, outbox.WithTable(ob.Table()))
	require.NoError(t, err)
	return ob, d, l
}

// lockLeases begins a transaction that makes every write to the lease table
// l wait until it ends: SQLite's write lock (BEGIN IMMEDIATE); on
// PostgreSQL LOCK TABLE l IN EXCLUSIVE MODE (reads pass), or with rows the
// lease rows there are locked FOR SHARE (a renewal's FOR UPDATE waits). It
// is rolled back at t's end if still open.
func lockLeases(t *testing.T, db *sql.DB, d sqldb.Dialect, l string, rows bool) *sql.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	switch {
	case d != sqldb.Postgres:
	case rows:
		var n int
		require.NoError(t, tx.QueryRowContext(ctx, "SELECT count(*) FROM (SELECT key FROM "+l+" FOR SHARE) AS x").Scan(&n))
		require.Positive(t, n, "lease rows locked")
	default:
		_, err = tx.ExecContext(ctx, "LOCK TABLE "+l+" IN EXCLUSIVE MODE")
		require.NoError(t, err)
	}
	return tx
}

// A leaseWrite is a lease row as a claim or a renewal wrote it.
type leaseWrite struct {
	key     string
	epoch   int64
	expires time.Time
}

// recordLeaseWrites installs triggers that copy each lease row written to
// l (inserted, or its expiry or epoch changed: a claim, a takeover, a
// renewal) into <l>_writes, in order.
func recordLeaseWrites(t *testing.T, db *sql.DB, d sqldb.Dialect, l string) {
	t.Helper()
	w := l + "_writes"
	var stmts []string
	if d == sqldb.Postgres {
		t.Cleanup(func() {
			_, _ = db.Exec("DROP TABLE IF EXISTS " + w)
			_, _ = db.Exec("DROP FUNCTION IF EXISTS " + w + "() CASCADE")
		})
		stmts = []string{
			`CREATE TABLE ` + w + ` (n BIGINT GENERATED ALWAYS AS IDENTITY, key TEXT NOT NULL, epoch BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL)`,
			`CREATE FUNCTION ` + w + `() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO ` + w + ` (key, epoch, expires_at) VALUES (NEW.key, NEW.epoch, NEW.expires_at); RETURN NULL; END $$`,
			`CREATE TRIGGER ` + w + ` AFTER INSERT OR UPDATE OF expires_at, epoch ON ` + l + ` FOR EACH ROW EXECUTE FUNCTION ` + w + `()`,
		}
	} else {
		ins := ` BEGIN INSERT INTO ` + w + ` (key, epoch, expires_at) VALUES (NEW.key, NEW.epoch, NEW.expires_at); END`
		stmts = []string{
			`CREATE TABLE ` + w + ` (n INTEGER PRIMARY KEY, key TEXT NOT NULL, epoch INTEGER NOT NULL, expires_at INTEGER NOT NULL)`,
			`CREATE TRIGGER ` + w + `_insert AFTER INSERT ON ` + l + ins,
			`CREATE TRIGGER ` + w + `_update AFTER UPDATE OF expires_at, epoch ON ` + l + ins,
		}
	}
	for _, s := range stmts {
		_, err := db.Exec(s)
		require.NoError(t, err, s)
	}
}

// readLeaseWrites returns the lease writes recordLeaseWrites recorded, in
// order, after the first skip.
func readLeaseWrites(t *testing.T, db *sql.DB, d sqldb.Dialect, l string, skip int) []leaseWrite {
	t.Helper()
	rows, err := db.Query(`SELECT key, epoch, expires_at FROM ` + l + `_writes ORDER BY n`)
	require.NoError(t, err)
	defer rows.Close()
	var ws []leaseWrite
	for rows.Next() {
		var w leaseWrite
		if d == sqldb.Postgres {
			require.NoError(t, rows.Scan(&w.key, &w.epoch, &w.expires))
		} else {
			var us int64
			require.NoError(t, rows.Scan(&w.key, &w.epoch, &us))
			w.expires = time.UnixMicro(us)
		}
		ws = append(ws, w)
	}
	require.NoError(t, rows.Err())
	return ws[min(skip, len(ws)):]
}

// checkLeaseWrites asserts that every lease written expires at least a
// lease after released (less leaseSlack).
func checkLeaseWrites(t *testing.T, ws []leaseWrite, released time.Time, lease time.Duration) {
	t.Helper()
	least := released.Add(lease - leaseSlack)
	all := make([]string, len(ws))
	for i, w := range ws {
		all[i] = fmt.Sprintf("%s/%d: %v", w.key, w.epoch, w.expires.Sub(released).Round(time.Millisecond))
	}
	for _, w := range ws {
		require.False(t, w.expires.Before(least),
			"key %s epoch %d: a lease written expiring %v after the lock was released (lease %v); all (key/epoch: expiry after the release): %v",
			w.key, w.epoch, w.expires.Sub(released), lease, all)
	}
	t.Logf("%d lease writes; the first expires %v after the lock was released (lease %v)", len(ws), ws[0].expires.Sub(released), lease)
}
