package outbox_test

import (
	"context"
	"database/sql"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/bus"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A key whose sink keeps failing holds at most its key batch of the relay's
// slots: every other key's events still go through, though the failing
// key's 100 events are the oldest in the outbox.
func TestFailingKeyDoesNotBlockOthers(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		for j := 0; j < 100; j++ {
			_, err := ob.Write(ctx, tx, outbox.Event{Key: "stuck", Payload: []byte(strconv.Itoa(j))})
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
		const keys, perKey = 30, 10
		writeEvents(t, ob, keys, perKey, 100)
		rec := newRecorder(keys * perKey)
		r, stop := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
			if e.Key == "stuck" {
				return errDown
			}
			return rec.sink(ctx, e)
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond),
			outbox.WithBatchSize(20), outbox.WithKeyBatch(5),
			outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 1000000, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}))
		rec.wait(t, 60*time.Second)
		require.LessOrEqual(t, r.Scheduler().KeyDepth("stuck"), 5, "the stuck key holds at most its key batch")
		stop()
		require.Zero(t, rec.check(t, keys, perKey))
		require.EqualValues(t, 100, counts(t, ob)[outbox.Pending], "the stuck key's events wait, none dead or lost")
	})
}

// On PostgreSQL a committed Write wakes an idle relay through NOTIFY: with a
// one-hour poll interval, the events still arrive, and the relay counts the
// notifications. Both ways: the schema's trigger notifies (the default), or,
// under WithNotifyFromWrite, there is no trigger and Write's statement
// notifies.
func TestListenNotifyWakesRelay(t *testing.T) {
	for _, c := range []struct {
		name    string
		make    func(*testing.T, *sql.DB) *outbox.Outbox
		trigger int // the NOTIFY trigger and its function present
	}{
		{"trigger", newOutbox, 1},
		{"from Write", newOutboxNotifyFromWrite, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			db := dbtest.Postgres(t)
			ob := c.make(t, db)
			tr, fn := notifyTriggers(t, db, ob.Table())
			require.Equal(t, [2]int{c.trigger, c.trigger}, [2]int{tr, fn}, "NOTIFY trigger and function")
			delivered := make(chan string, 10)
			r, _ := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
				delivered <- string(e.Payload)
				return nil
			}, outbox.WithLogger(quiet), outbox.WithPollInterval(time.Hour), outbox.WithLeaseDuration(3*time.Hour))
			require.Eventually(t, func() bool { return r.Stats().Listening }, 30*time.Second, time.Millisecond)
			for _, p := range []string{"first", "second", "third"} {
				// Writers notify an idle relay only (see
				// TestWriteRacingTheRelayGoingIdleIsFoundByItsNextPoll): wait
				// until it is, after the previous row.
				waitUntil(t, "relay idle", func() bool { return outbox.Idle(r) })
				commitEvent(t, ob, "k", p)
				select {
				case got := <-delivered:
					require.Equal(t, p, got)
				case <-time.After(30 * time.Second):
					t.Fatalf("event %s not delivered: no wake-up (poll interval is an hour)", p)
				}
			}
			// Each commit sent a notification and the relay received it (a
			// row may also have been found first by a poll that the previous
			// row's settling triggered).
			require.Eventually(t, func() bool { return r.Stats().Notifications >= 3 }, 30*time.Second, time.Millisecond)
		})
	}
}

// BusSink publishes on the in-process bus, in order per key, with the
// event's ID in the envelope.
func TestBusSink(t *testing.T) {
	ctx := context.Background()
	db := dbtest.SQLite(t)
	ob := newOutbox(t, db)
	b, err := bus.New[string](bus.WithWorkers(4), bus.WithLogger(quiet))
	require.NoError(t, err)
	const keys, perKey = 10, 20
	var mu sync.Mutex
	byKey := map[string][]int{}
	ids := map[string]bool{}
	all := make(chan struct{})
	n := 0
	type deposit struct{ amount int }
	_, err = bus.Subscribe(b, "ledger", func(ctx context.Context, env bus.Envelope[string], d deposit) error {
		mu.Lock()
		defer mu.Unlock()
		byKey[env.Key] = append(byKey[env.Key], d.amount)
		ids[env.ID] = true
		if n++; n == keys*perKey {
			close(all)
		}
		return nil
	})
	require.NoError(t, err)
	writeEvents(t, ob, keys, perKey, 50)
	_, stop := startRelay(t, ob, outbox.BusSink(b, func(e outbox.Event) (any, error) {
		j, err := strconv.Atoi(string(e.Payload))
		return deposit{j}, err
	}), outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond))
	select {
	case <-all:
	case <-time.After(30 * time.Second):
		t.Fatal("timed out")
	}
	stop()
	require.NoError(t, b.Close(ctx))
	require.Len(t, ids, keys*perKey)
	for k, js := range byKey {
		for i, j := range js {
			require.Equal(t, i, j, "key %s in order", k)
		}
	}
}

// On PostgreSQL a row can commit after a later-inserted row of its key was
// already published (two transactions on one key, committing out of insert
// order). It is published anyway, though the key never goes idle: a relay
// re-reads a key from its oldest pending row at least once per lease.
func TestLateCommittedRowOnBusyKey(t *testing.T) {
	db := dbtest.Postgres(t)
	ctx := context.Background()
	ob := newOutbox(t, db)
	late, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = ob.Write(ctx, late, outbox.Event{ID: "late", Key: "busy", Payload: []byte("late")})
	require.NoError(t, err)

	write := func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err = ob.Write(ctx, tx, outbox.Event{Key: "busy", Payload: []byte("x")}); err != nil {
			return err
		}
		return tx.Commit()
	}
	got := make(chan string, 1)
	var once sync.Once
	r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		if e.ID == "late" {
			once.Do(func() { got <- e.ID })
			return nil
		}
		// Keep the key busy: every publish writes the key's next row
		// before it returns, so the relay never finds the key idle.
		select {
		case got <- e.ID:
		default:
		}
		return write()
	}, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond), outbox.WithLeaseDuration(300*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, write())
	runRelay(t, r)
	<-got // a later row of the key is out
	require.NoError(t, late.Commit())
	deadline := time.After(30 * time.Second)
	for {
		select {
		case id := <-got:
			if id == "late" {
				return
			}
		case <-deadline:
			t.Fatal("the late-committed row was never published")
		}
	}
}

// A sink call that overruns WithSinkTimeout is a failed attempt; once the
// attempts are spent the row is dead with the deadline error.
func TestSinkTimeout(t *testing.T) {
	ctx := context.Background()
	db := dbtest.SQLite(t)
	ob := newOutbox(t, db)
	writeEvents(t, ob, 1, 1, 1)
	dead := make(chan outbox.DeadEvent, 1)
	startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
		<-ctx.Done() // a hung endpoint
		return ctx.Err()
	}, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond), outbox.WithSinkTimeout(20*time.Millisecond),
		outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}),
		outbox.WithOnDead(func(d outbox.DeadEvent) { dead <- d }))
	d := <-dead
	require.Equal(t, 2, d.Attempts)
	require.Contains(t, d.Err, context.DeadlineExceeded.Error())
	rows, err := ob.Dead(ctx, 1)
	require.NoError(t, err)
	require.Len(t, rows, 1)
}

// Two relays with short leases hand keys back and forth while they publish
// (a key held longer than a lease drains and is claimed again, by either):
// every key's events still arrive in order, complete, never published by
// both relays at once.
func TestKeyHandoffBetweenRelays(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		const keys, perKey = 30, 30
		rec := newRecorder(keys * perKey)
		var published [2]int
		by := map[string]map[int]bool{} // key -> relays that published it
		var mu sync.Mutex
		mk := func(i int) *outbox.Relay {
			r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
				mu.Lock()
				published[i]++
				if by[e.Key] == nil {
					by[e.Key] = map[int]bool{}
				}
				by[e.Key][i] = true
				mu.Unlock()
				return rec.sink(ctx, e)
			}, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond),
				outbox.WithLeaseDuration(150*time.Millisecond), outbox.WithBatchSize(50), outbox.WithKeyBatch(3))
			require.NoError(t, err)
			return r
		}
		a, b := mk(0), mk(1)
		stopA, stopB := runRelay(t, a), runRelay(t, b)
		writeEvents(t, ob, keys, perKey, 20)
		rec.wait(t, 60*time.Second)
		stopA()
		stopB()
		dups := rec.check(t, keys, perKey)
		both := 0
		for _, rs := range by {
			if len(rs) == 2 {
				both++
			}
		}
		t.Logf("%s: relay a published %d, b %d; %d keys published by both; duplicates %d, leases lost %d+%d", dbtest.Name(db),
			published[0], published[1], both, dups, a.Stats().LeasesLost, b.Stats().LeasesLost)
		require.Empty(t, counts(t, ob))
	})
}

// With a pool of one connection (common with SQLite), Write inside the
// caller's transaction needs no second connection, and the relay shares the
// one connection without deadlocking.
func TestPoolOfOneConnection(t *testing.T) {
	db := dbtest.SQLite(t)
	db.SetMaxOpenConns(1)
	ob := newOutbox(t, db)
	const keys, perKey = 5, 5
	rec := newRecorder(keys * perKey)
	_, stop := startRelay(t, ob, rec.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond))
	writeEvents(t, ob, keys, perKey, 5)
	rec.wait(t, 30*time.Second)
	stop()
	require.Zero(t, rec.check(t, keys, perKey))
	require.Empty(t, counts(t, ob))
}

// A sink that panics is a failed call like one that returns an error:
// SinkErrors counts every panicking call, the row dies after MaxAttempts with
// the panic as its error.
func TestSinkPanicCountsAsSinkError(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, 1, 1)
		died := make(chan struct{})
		r, stop := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
			panic("sink bug")
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond),
			outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}),
			outbox.WithOnDead(func(outbox.DeadEvent) { close(died) }))
		select {
		case <-died:
		case <-time.After(30 * time.Second):
			t.Fatal("the panicking row was not marked dead")
		}
		stop()
		st := r.Stats()
		require.EqualValues(t, 2, st.SinkErrors, "each panicking call counts")
		require.EqualValues(t, 1, st.Dead)
		require.Zero(t, st.Published)
		dead, err := ob.Dead(ctx, 10)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		require.Equal(t, 2, dead[0].Attempts)
		require.Contains(t, dead[0].Err, "sink bug")
	})
}
