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

// Two live relays under one WithOwner name (a restart or a rolling deploy
// while the old process still runs, two replicas configured alike). Before
// the fencing token, both held every key: the lease query let a relay take a
// live lease of its own name, and the other's renewals kept succeeding.
// Seen: 4 to 35 (SQLite) and 34 to 36 (PostgreSQL) sink calls overlapping
// another on the same key. Now a lease is a relay's by name and token, so
// each key has one holder at a time: no overlap, in order, complete.
func TestSameOwnerTwoLiveRelays(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		const keys, perKey = 4, 60
		writeEvents(t, ob, keys, perKey, 40)
		rec := newRecorder(keys * perKey)
		slow := slowSink(rec)
		var stops []func()
		var relays []*outbox.Relay
		for range 2 {
			r, err := ob.NewRelay(slow, outbox.WithLogger(quiet), outbox.WithOwner("svc-1"),
				outbox.WithPollInterval(5*time.Millisecond), outbox.WithBatchSize(20), outbox.WithKeyBatch(5))
			require.NoError(t, err)
			relays = append(relays, r)
			stops = append(stops, runRelay(t, r))
		}
		require.NotEqual(t, relays[0].Token(), relays[1].Token())
		rec.wait(t, 30*time.Second)
		for _, stop := range stops {
			stop()
		}
		require.Zero(t, rec.check(t, keys, perKey), "duplicates: nothing was lost or taken over") // and no overlap
		require.Empty(t, counts(t, ob))
	})
}

// slowSink returns a Sink that delivers to rec and takes a few milliseconds,
// during which a second call on the same key counts as an overlap in rec. It
// returns at once when ctx ends (the relay's lease on the key ended or was
// taken), without delivering, as the Sink contract asks: a sink that ignored
// its context could land after the lease's next holder started publishing,
// the hole the package doc describes, whatever the owner names.
func slowSink(rec *recorder) outbox.Sink {
	return func(ctx context.Context, e outbox.Event) error {
		v, _ := rec.busy.LoadOrStore(e.Key, new(atomic.Int32))
		b := v.(*atomic.Int32)
		if b.Add(1) != 1 {
			rec.overlaps.Add(1)
		}
		defer b.Add(-1)
		t := time.NewTimer(2 * time.Millisecond) // widens the window; not synchronisation
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		rec.record(e)
		return nil
	}
}

// The same two live relays of one name while keys move between them: events
// are written in waves, one per key, each wave once the last was delivered,
// so that every key goes idle, is released, and is claimed again by either
// relay. Leases are long (no expiry in the test, so no row is given back):
// every event arrives exactly once, in order, never two calls on one key at
// once, and keys were published by both relays.
func TestSameOwnerKeyHandoff(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		const keys, waves = 10, 15
		rec := newRecorder(keys * waves)
		slow := slowSink(rec)
		var mu sync.Mutex
		by := map[string]map[int]bool{} // key -> relays that published it
		mk := func(i int) *outbox.Relay {
			r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
				mu.Lock()
				if by[e.Key] == nil {
					by[e.Key] = map[int]bool{}
				}
				by[e.Key][i] = true
				mu.Unlock()
				return slow(ctx, e)
			}, outbox.WithLogger(quiet), outbox.WithOwner("svc-1"), outbox.WithPollInterval(5*time.Millisecond),
				outbox.WithMaxKeys(keys/2)) // each relay has to leave keys to the other
			require.NoError(t, err)
			return r
		}
		a, b := mk(0), mk(1)
		stopA, stopB := runRelay(t, a), runRelay(t, b)
		ctx := context.Background()
		for j := range waves {
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			for k := range keys {
				_, err := ob.Write(ctx, tx, outbox.Event{Key: key(k), Type: "test", Payload: []byte(strconv.Itoa(j))})
				require.NoError(t, err)
			}
			require.NoError(t, tx.Commit())
			require.Eventually(t, func() bool {
				rec.mu.Lock()
				defer rec.mu.Unlock()
				return len(rec.ids) >= (j+1)*keys
			}, 30*time.Second, time.Millisecond, "wave %d not delivered", j)
			// A drained key lingers with its relay (ten poll intervals):
			// wait until both have let their keys go, so that the next
			// wave's keys are claimed afresh, by either relay.
			require.Eventually(t, func() bool {
				return a.Stats().KeysHeld == 0 && b.Stats().KeysHeld == 0
			}, 30*time.Second, time.Millisecond, "keys still held after wave %d", j)
		}
		rec.wait(t, 30*time.Second)
		stopA()
		stopB()
		require.Zero(t, rec.check(t, keys, waves), "duplicates") // and order, completeness, no overlap
		both := 0
		for _, rs := range by {
			if len(rs) == 2 {
				both++
			}
		}
		t.Logf("%s: %d of %d keys published by both relays", dbtest.Name(db), both, keys)
		require.Positive(t, both, "no key moved between the relays: the test proved nothing")
		require.Empty(t, counts(t, ob))
	})
}

// expireLeases makes every lease of ob expired, as if its holder had died a
// lease duration ago.
func expireLeases(t *testing.T, ob *outbox.Outbox) {
	t.Helper()
	q := `UPDATE ` + ob.Table() + `_lease SET expires_at = 0`
	if ob.Dialect() == outbox.Postgres {
		q = `UPDATE ` + ob.Table() + `_lease SET expires_at = now() - interval '1 second'`
	}
	_, err := ob.DB().ExecContext(context.Background(), q)
	require.NoError(t, err)
}

// stealLease gives key's lease to another relay of the same name (another
// token), as a relay that took it over after it expired would hold it. It
// may be called from any goroutine.
func stealLease(ob *outbox.Outbox, key string) error {
	q := `UPDATE ` + ob.Table() + `_lease SET token = 'intruder' WHERE key = ?`
	if ob.Dialect() == outbox.Postgres {
		q = strings.Replace(q, "?", "$1", 1)
	}
	res, err := ob.DB().ExecContext(context.Background(), q, key)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("key %s: %d lease rows changed (%w)", key, n, err)
	}
	return nil
}

// leaseTokens returns the lease table's key -> token.
func leaseTokens(t *testing.T, ob *outbox.Outbox) map[string]string {
	t.Helper()
	rows, err := ob.DB().QueryContext(context.Background(), `SELECT key, COALESCE(token, '') FROM `+ob.Table()+`_lease`)
	require.NoError(t, err)
	defer rows.Close()
	m := map[string]string{}
	for rows.Next() {
		var k, tok string
		require.NoError(t, rows.Scan(&k, &tok))
		m[k] = tok
	}
	require.NoError(t, rows.Err())
	return m
}

// waitPolls waits until r has made n more polls (each walks every key here:
// the tests have a handful).
func waitPolls(t *testing.T, r *outbox.Relay, n uint64) {
	t.Helper()
	from := r.Stats().Polls
	require.Eventually(t, func() bool { return r.Stats().Polls >= from+n }, 30*time.Second, time.Millisecond)
}

// A relay restarted under the same name while its crashed predecessor's
// leases are live does not take them (they are the predecessor's token: it
// may still be running); once they expire it publishes every key from its
// oldest pending row: the predecessor's unmarked rows again, in order,
// nothing lost.
func TestRestartWithSameOwnerWaitsForLeases(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		const keys, perKey = 5, 4
		ob, opts := crashedWithLiveLeases(t, db, keys, perKey)

		second := newRecorder(keys * perKey)
		b, stop := startRelay(t, ob, second.sink, opts...)
		waitPolls(t, b, 3)
		require.Zero(t, b.Stats().Published, "took a live lease of another relay of its name")
		expireLeases(t, ob)
		second.wait(t, 30*time.Second)
		stop()
		require.Zero(t, second.check(t, keys, perKey))
		require.Empty(t, counts(t, ob))
		require.Empty(t, leaseTokens(t, ob))
	})
}

// A relay whose lease was taken by another relay of its name stops
// publishing the key as soon as it finds out: the renewal that misses the
// key cancels the sink call in flight; the row stays pending for the
// lease's holder, whose lease row the fenced relay leaves alone.
func TestFencedRelayCancelsSinkCall(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, 2, 10)
		started := make(chan struct{}, 1)
		var calls atomic.Int32
		ended := make(chan error, 1)
		r, stop := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
			calls.Add(1)
			started <- struct{}{}
			<-ctx.Done() // a long publish, cut short by the fence
			ended <- ctx.Err()
			return ctx.Err()
		}, outbox.WithLogger(quiet), outbox.WithOwner("svc-1"), outbox.WithPollInterval(5*time.Millisecond),
			outbox.WithLeaseDuration(time.Hour))
		<-started
		require.NoError(t, stealLease(ob, key(0)))
		outbox.Renew(r)
		select {
		case err := <-ended:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(30 * time.Second):
			t.Fatal("the fenced relay's sink call was not cancelled")
		}
		waitPolls(t, r, 3)
		require.EqualValues(t, 1, calls.Load(), "the fenced relay published the key again")
		require.EqualValues(t, 1, r.Stats().LeasesLost)
		stop()
		require.Equal(t, map[outbox.State]int64{outbox.Pending: 2}, counts(t, ob))
		require.Equal(t, map[string]string{key(0): "intruder"}, leaseTokens(t, ob), "the fenced relay released the holder's lease")
	})
}

// A relay whose lease was taken while its sink call ran does not mark the
// row: neither sent (the call succeeded) nor dead (it failed for good). The
// row stays pending for the lease's holder.
func TestFencedRelayDoesNotMark(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{{"sent", nil}, {"dead", keysched.Permanent(errors.New("rejected"))}} {
		t.Run(tc.name, func(t *testing.T) {
			dbtest.Each(t, func(t *testing.T, db *sql.DB) {
				ob := newOutbox(t, db)
				writeEvents(t, ob, 1, 1, 1)
				var calls atomic.Int32
				r, stop := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
					calls.Add(1)
					if err := stealLease(ob, e.Key); err != nil { // taken while the call runs
						t.Error(err)
					}
					return tc.err
				}, outbox.WithLogger(quiet), outbox.WithOwner("svc-1"), outbox.WithPollInterval(5*time.Millisecond),
					outbox.WithLeaseDuration(time.Hour), outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 1}))
				require.Eventually(t, func() bool { return r.Stats().LeasesLost == 1 }, 30*time.Second, time.Millisecond)
				waitPolls(t, r, 3)
				stop()
				st := r.Stats()
				require.EqualValues(t, 1, calls.Load())
				require.Zero(t, st.Marked)
				require.Zero(t, st.Dead)
				require.EqualValues(t, 1, st.Abandoned)
				require.Equal(t, map[outbox.State]int64{outbox.Pending: 1}, counts(t, ob))
				require.Equal(t, map[string]string{key(0): "intruder"}, leaseTokens(t, ob))
			})
		})
	}
}

// oldSchema returns the DDL of the version before the token column (token
// false) or before the epoch column (token true): Schema without the
// columns and the statements that add them (and the epoch counter).
func oldSchema(ob *outbox.Outbox, token bool) []string {
	var old []string
	for _, s := range ob.Schema() {
		if strings.Contains(s, "_lease_epoch") || strings.Contains(s, "ADD COLUMN IF NOT EXISTS epoch") ||
			(!token && strings.Contains(s, "ADD COLUMN IF NOT EXISTS token")) {
			continue
		}
		for _, col := range []string{",\n\tepoch      BIGINT NOT NULL DEFAULT 0", ",\n\tepoch      INTEGER NOT NULL DEFAULT 0"} {
			s = strings.Replace(s, col, "", 1)
		}
		if !token {
			s = strings.Replace(s, ",\n\ttoken      TEXT\n)", "\n)", 1)
		}
		old = append(old, s)
	}
	return old
}

// A database created by an older schema (no token column, or a token but
// no epoch column), with leases of a relay of that version in it: a relay
// refuses it with ErrSchemaOutdated; CreateSchema (twice: idempotent) adds
// what is missing; then a relay publishes every key but the one whose old
// lease is still live, and takes over the expired one.
func TestUpgradeFromOlderSchema(t *testing.T) {
	for _, token := range []bool{false, true} {
		t.Run(map[bool]string{false: "without_token", true: "without_epoch"}[token], func(t *testing.T) {
			dbtest.Each(t, func(t *testing.T, db *sql.DB) { upgradeFromOlderSchema(t, db, token) })
		})
	}
}

func upgradeFromOlderSchema(t *testing.T, db *sql.DB, token bool) {
	ctx := context.Background()
	ob, err := outbox.New(db, outbox.WithTable(dbtest.Table(t, db, "ob")))
	require.NoError(t, err)
	lease := ob.Table() + "_lease"
	for _, s := range oldSchema(ob, token) {
		_, err := db.ExecContext(ctx, s)
		require.NoError(t, err, s)
	}
	_, err = db.ExecContext(ctx, `SELECT epoch FROM `+lease)
	require.Error(t, err, "the old schema has an epoch column")
	_, err = db.ExecContext(ctx, `SELECT token FROM `+lease)
	require.Equal(t, token, err == nil, "the old schema's token column")
	const keys, perKey = 3, 5
	writeEvents(t, ob, keys, perKey, 10)
	// k000: live lease of an old-version relay; k001: its expired one.
	cols, tok := "", ""
	if token {
		cols, tok = ", token", ", 'old-token'"
	}
	ins := `INSERT INTO ` + lease + ` (key, owner, expires_at` + cols + `) VALUES (?, 'old-relay', ?` + tok + `), (?, 'old-relay', ?` + tok + `)`
	args := []any{key(0), time.Now().Add(time.Hour).UnixMicro(), key(1), int64(0)}
	if ob.Dialect() == outbox.Postgres {
		ins = `INSERT INTO ` + lease + ` (key, owner, expires_at` + cols + `) VALUES ($1, 'old-relay', now() + interval '1 hour'` + tok + `), ($2, 'old-relay', now() - interval '1 hour'` + tok + `)`
		args = []any{key(0), key(1)}
	}
	_, err = db.ExecContext(ctx, ins, args...)
	require.NoError(t, err)

	rec := newRecorder(0)
	r, err := ob.NewRelay(rec.sink, outbox.WithLogger(quiet))
	require.NoError(t, err)
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a failure, not a hang
	defer cancel()
	require.ErrorIs(t, r.Run(rctx), outbox.ErrSchemaOutdated)
	require.NoError(t, r.Close(ctx))

	require.NoError(t, ob.CreateSchema(ctx))
	require.NoError(t, ob.CreateSchema(ctx))
	want := map[string]string{key(0): "", key(1): ""}
	if token {
		want = map[string]string{key(0): "old-token", key(1): "old-token"}
	}
	require.Equal(t, want, leaseTokens(t, ob), "leases kept by the upgrade")

	var log claimLog
	rec = newRecorder((keys - 1) * perKey)
	r, err = ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		log.record(ctx, e)
		return rec.sink(ctx, e)
	}, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond))
	require.NoError(t, err)
	stop := runRelay(t, r)
	rec.wait(t, 30*time.Second)
	waitPolls(t, r, 3)
	stop()
	rec.mu.Lock()
	require.Empty(t, rec.byKey[key(0)], "published a key under an old relay's live lease")
	delete(rec.byKey, key(0))
	rec.mu.Unlock()
	require.Zero(t, rec.check(t, keys-1, perKey))
	for _, c := range log.snapshot() {
		require.Positive(t, c.Epoch, "a claim on the upgraded table")
	}
	require.Equal(t, map[outbox.State]int64{outbox.Pending: perKey}, counts(t, ob))
	delete(want, key(1))
	require.Equal(t, want, leaseTokens(t, ob))
}

// WithTakeOverOnStart: a relay restarted under the same name after a crash
// takes its predecessor's live leases (an hour long here) at once and
// publishes everything from each key's oldest pending row, in order.
func TestTakeOverOnStartAfterCrash(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		const keys, perKey = 5, 4
		ob, opts := crashedWithLiveLeases(t, db, keys, perKey)

		second := newRecorder(keys * perKey)
		_, stop := startRelay(t, ob, second.sink, append(opts, outbox.WithTakeOverOnStart())...)
		second.wait(t, 30*time.Second)
		stop()
		require.Zero(t, second.check(t, keys, perKey))
		require.Empty(t, counts(t, ob))
		require.Empty(t, leaseTokens(t, ob))
	})
}

// WithTakeOverOnStart while the predecessor of the name is in fact still
// running: the new relay takes every key at once; the old one is fenced out
// (its renewal cancels its sink call in flight) and publishes nothing more.
// Everything arrives, in order among the new relay's calls.
func TestTakeOverOnStartFencesLivePredecessor(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		const keys, perKey = 3, 4
		writeEvents(t, ob, keys, perKey, 50)
		opts := []outbox.RelayOption{outbox.WithLogger(quiet), outbox.WithPollInterval(5 * time.Millisecond),
			outbox.WithLeaseDuration(time.Hour), outbox.WithOwner("svc-1")}
		started := make(chan struct{})
		ended := make(chan error, 1)
		var oldCalls atomic.Int32
		a, stopA := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
			if oldCalls.Add(1) == 1 {
				close(started)
			}
			<-ctx.Done() // hangs until fenced
			if e.Key == key(0) && e.Seq == 1 {
				ended <- ctx.Err()
			}
			return ctx.Err()
		}, append(opts, outbox.WithKeyBatch(1), outbox.WithBatchSize(1), outbox.WithMaxKeys(1))...)
		<-started // a holds k000 and publishes its first row

		rec := newRecorder(keys * perKey)
		_, stopB := startRelay(t, ob, rec.sink, append(opts, outbox.WithTakeOverOnStart())...)
		rec.wait(t, 30*time.Second)
		outbox.Renew(a)
		select {
		case err := <-ended:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(30 * time.Second):
			t.Fatal("the superseded relay's sink call was not cancelled")
		}
		stopB()
		stopA()
		require.EqualValues(t, 1, oldCalls.Load(), "the superseded relay published again")
		require.Zero(t, rec.check(t, keys, perKey))
		require.Empty(t, counts(t, ob))
		require.Empty(t, leaseTokens(t, ob))
	})
}

func TestTakeOverOnStartNeedsOwner(t *testing.T) {
	ob := newOutbox(t, dbtest.SQLite(t))
	_, err := ob.NewRelay(func(context.Context, outbox.Event) error { return nil }, outbox.WithTakeOverOnStart())
	require.ErrorIs(t, err, outbox.ErrInvalidOption)
}

// crashedWithLiveLeases writes keys×perKey events, runs a relay under the
// owner name "orders-relay-1" with hour-long leases that publishes every
// event without marking any, and crashes it (its leases stay, live). It
// returns the outbox and that relay's options, for its successor.
func crashedWithLiveLeases(t *testing.T, db *sql.DB, keys, perKey int) (*outbox.Outbox, []outbox.RelayOption) {
	t.Helper()
	ob := newOutbox(t, db)
	writeEvents(t, ob, keys, perKey, 50)
	opts := []outbox.RelayOption{outbox.WithLogger(quiet), outbox.WithPollInterval(10 * time.Millisecond),
		outbox.WithLeaseDuration(time.Hour), outbox.WithOwner("orders-relay-1")}
	first := newRecorder(keys * perKey)
	a, err := ob.NewRelay(first.sink, opts...)
	require.NoError(t, err)
	outbox.NoMark(a)
	outbox.Crash(a)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	first.wait(t, 30*time.Second)
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	require.Len(t, leaseTokens(t, ob), keys, "the crashed relay left its leases")
	return ob, opts
}
