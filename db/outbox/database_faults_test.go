package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
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
	"github.com/keysched/keysched/db/sqldb"
)

// logLines is a slog.Handler that counts records by message (all levels).
type logLines struct {
	mu  sync.Mutex
	n   map[string]int
	all []string
}

func newLogLines() *logLines { return &logLines{n: map[string]int{}} }

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logLines) WithGroup(string) slog.Handler            { return l }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n[r.Message]++
	l.all = append(l.all, b.String())
	return nil
}

// count returns the records whose message contains s.
func (l *logLines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for m, c := range l.n {
		if strings.Contains(m, s) {
			n += c
		}
	}
	return n
}

func (l *logLines) dump() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.all, "\n")
}

// Log messages of the relay's database health (see health.go).
const (
	msgFailing   = "database failing"
	msgStill     = "database still failing"
	msgRecovered = "database recovered"
)

// idemWriter writes event j of key k with the ID "k/j" in a transaction of
// its own, retrying while the database is away, as an application would
// (a duplicate ID means an earlier try committed).
func idemWrite(ctx context.Context, ob *outbox.Outbox, k string, j int) error {
	for {
		err := func() error {
			tx, err := ob.DB().BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if _, err := ob.Write(ctx, tx, outbox.Event{ID: fmt.Sprintf("%s/%d", k, j), Key: k, Payload: []byte(fmt.Sprint(j))}); err != nil {
				return err
			}
			return tx.Commit()
		}()
		if err == nil || errors.Is(err, outbox.ErrDuplicateID) {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A server restarted (stopped fast, then started after longer than a lease)
// and then crashed (SIGKILL, started again) while two relays publish and an
// application writes: Run never returns, the relays reconnect and claim the
// keys whose leases expired meanwhile, every event arrives in order, and each
// relay logs the outage as a few lines (failing, at most one "still
// failing", recovered), not one per failed call.
func TestRelaySurvivesServerRestart(t *testing.T) {
	srv := dbtest.NewServer(t)
	db := srv.Open(t)
	ob := newOutbox(t, db)
	const keys, perKey = 8, 30
	rec := newRecorder(keys * perKey)
	sink := func(ctx context.Context, e outbox.Event) error {
		time.Sleep(2 * time.Millisecond) // a backlog: keys are held when the server goes
		return rec.sink(ctx, e)
	}
	lease := 300 * time.Millisecond
	var logs [2]*logLines
	var relays [2]*outbox.Relay
	errc := make(chan error, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range relays {
		logs[i] = newLogLines()
		r, err := ob.NewRelay(sink, outbox.WithLeaseDuration(lease), outbox.WithPollInterval(20*time.Millisecond),
			outbox.WithLogger(slog.New(logs[i])), outbox.WithOwner(fmt.Sprintf("relay-%d", i)))
		require.NoError(t, err)
		relays[i] = r
		go func() { errc <- r.Run(ctx) }()
	}
	var wrote atomic.Int64
	var wg sync.WaitGroup
	for k := range keys {
		wg.Go(func() {
			for j := range perKey {
				require.NoError(t, idemWrite(ctx, ob, key(k), j))
				wrote.Add(1)
			}
		})
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	delivered := func() int {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.ids)
	}
	t0 := time.Now()
	phase := func(what string) {
		t.Logf("%v: %s (%d delivered)", time.Since(t0).Round(time.Millisecond), what, delivered())
	}
	waitFor("a third delivered", func() bool { return delivered() >= keys*perKey/3 })
	phase("stop")
	require.NotZero(t, relays[0].Stats().KeysHeld+relays[1].Stats().KeysHeld, "keys leased when the server stops")
	srv.Stop()
	time.Sleep(3 * lease) // every lease expires
	phase("start")
	srv.Start()
	phase("started")
	waitFor("two thirds delivered", func() bool { return delivered() >= 2*keys*perKey/3 })
	phase("kill")
	srv.Kill()
	time.Sleep(3 * lease)
	phase("start")
	srv.Start()
	phase("started")
	wg.Wait()
	phase("written")
	rec.wait(t, 30*time.Second)
	phase("delivered")
	for i, r := range relays {
		waitHealthy(t, r)
		waitUntil(t, fmt.Sprintf("relay %d listening again", i), func() bool { return r.Stats().Listening })
	}
	select {
	case err := <-errc:
		t.Fatalf("Run returned during the outage: %v", err)
	default:
	}
	for i, r := range relays {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		require.NoError(t, r.Close(cctx))
		ccancel()
		require.NoError(t, <-errc)
		st := r.Stats()
		t.Logf("relay %d: %+v", i, st)
		require.NotZero(t, st.DBErrorKinds.Connection, "relay %d: connection errors counted", i)
		require.Equal(t, st.DBErrors, st.DBErrorKinds.Connection+st.DBErrorKinds.Timeout+st.DBErrorKinds.Conflict+
			st.DBErrorKinds.Schema+st.DBErrorKinds.Storage+st.DBErrorKinds.Other, "relay %d: kinds add up", i)
		require.Zero(t, st.DBFailingFor, "relay %d: recovered", i)
		// Two outages: a line when each starts, "still failing" after
		// 10 and 100 failed calls, one when it ends (the two merge into
		// one when no poll succeeded in between; a call that fails on a
		// connection broken by the outage after the recovery may add a
		// pair).
		failing, still, recovered := logs[i].count(msgFailing), logs[i].count(msgStill), logs[i].count(msgRecovered)
		require.GreaterOrEqual(t, failing, 1, "relay %d logs:\n%s", i, logs[i].dump())
		require.LessOrEqual(t, failing, 4, "relay %d logs:\n%s", i, logs[i].dump())
		require.LessOrEqual(t, still, 4, "relay %d logs:\n%s", i, logs[i].dump())
		require.Equal(t, failing, recovered, "relay %d logs:\n%s", i, logs[i].dump())
		require.Less(t, failing+still+recovered, int(st.DBErrors), "relay %d: fewer lines than failed calls", i)
	}
	dups := rec.check(t, keys, perKey)
	t.Logf("%d events, %d duplicates", keys*perKey, dups)
	require.Zero(t, counts(t, ob)[outbox.Pending], "nothing left pending")
}

// With WithMaxOutage, a relay whose database stays away returns from Run
// with an error wrapping ErrDatabaseUnavailable (and the last error, a
// connection error) once the bound has passed; without it, Run goes on.
func TestRunGivesUpAfterMaxOutage(t *testing.T) {
	srv := dbtest.NewServer(t)
	db := srv.Open(t)
	ob := newOutbox(t, db)
	rec := newRecorder(0)
	bounded, err := ob.NewRelay(rec.sink, outbox.WithPollInterval(20*time.Millisecond), outbox.WithMaxOutage(time.Second), outbox.WithLogger(quiet))
	require.NoError(t, err)
	forever, err := ob.NewRelay(rec.sink, outbox.WithPollInterval(20*time.Millisecond), outbox.WithLogger(quiet))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errB, errF := make(chan error, 1), make(chan error, 1)
	go func() { errB <- bounded.Run(ctx) }()
	go func() { errF <- forever.Run(ctx) }()
	waitPolls(t, bounded, 3)
	waitPolls(t, forever, 3)
	stopped := time.Now()
	srv.Stop()
	select {
	case err := <-errB:
		took := time.Since(stopped)
		t.Logf("Run returned after %v: %v", took, err)
		require.ErrorIs(t, err, outbox.ErrDatabaseUnavailable)
		require.Equal(t, sqldb.KindConnection, sqldb.Classify(err), "wraps the last (connection) error")
		require.GreaterOrEqual(t, took, time.Second)
		require.Less(t, took, 10*time.Second)
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not give up")
	}
	select {
	case err := <-errF:
		t.Fatalf("Run without WithMaxOutage returned: %v", err)
	default:
	}
	require.Greater(t, forever.Stats().DBFailingFor, 500*time.Millisecond)
	srv.Start()
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	require.NoError(t, forever.Close(cctx))
	require.NoError(t, <-errF)
	require.Error(t, bounded.Close(cctx), "Close after Run gave up reports the failed release")
}

// Close is bounded by its context (plus keysched.CloseGrace) while the
// server hangs (every server process stopped with SIGSTOP: queries and new
// connections wait, nothing fails by itself), with a relay holding keys and
// published rows to mark: it returns an error wrapping the context's
// (before: it waited for Run's last calls, marks and release, each bounded
// by a third of the lease, at least 5 s). Run returns once the server
// answers again.
func TestCloseBoundedWhileServerHangs(t *testing.T) {
	srv := dbtest.NewServer(t)
	db := srv.Open(t)
	ob := newOutbox(t, db)
	writeEvents(t, ob, 4, 50, 50)
	var calls atomic.Int64
	sink := func(ctx context.Context, e outbox.Event) error {
		calls.Add(1)
		select {
		case <-time.After(2 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r, err := ob.NewRelay(sink, outbox.WithLogger(quiet), outbox.WithPollInterval(20*time.Millisecond), outbox.WithLeaseDuration(9*time.Second))
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	for calls.Load() < 20 {
		time.Sleep(time.Millisecond)
	}
	srv.Pause()
	defer srv.Resume()
	cctx, ccancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer ccancel()
	start := time.Now()
	err = r.Close(cctx)
	took := time.Since(start)
	t.Logf("Close took %v: %v", took, err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, took, 300*time.Millisecond+keysched.CloseGrace+time.Second, "Close bounded by its context plus the grace (and a second for a loaded machine)")
	srv.Resume()
	select {
	case err := <-errc:
		require.NoError(t, err)
		t.Logf("Run returned %v after Close", time.Since(start))
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
}

// Run on a database without the outbox's tables returns an error wrapping
// ErrNoSchema at once (before: it polled and logged a failed call every
// poll interval, for ever); on a lease table without the token column,
// ErrSchemaOutdated (as before).
func TestRunWithoutSchemaFailsAtOnce(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		table := dbtest.Table(t, db, "nos")
		ob, err := outbox.New(db, outbox.WithTable(table))
		require.NoError(t, err)
		logs := newLogLines()
		run := func() error {
			r, err := ob.NewRelay(newRecorder(0).sink, outbox.WithLogger(slog.New(logs)), outbox.WithPollInterval(10*time.Millisecond))
			require.NoError(t, err)
			errc := make(chan error, 1)
			go func() { errc <- r.Run(ctx) }()
			select {
			case err := <-errc:
				require.NoError(t, r.Close(ctx))
				return err
			case <-time.After(10 * time.Second):
				require.NoError(t, r.Close(ctx))
				t.Fatal("Run did not return")
				return nil
			}
		}
		err = run()
		require.ErrorIs(t, err, outbox.ErrNoSchema)
		require.Contains(t, err.Error(), table)
		t.Log(err)
		// The outbox table alone: the lease table is missing.
		_, err = db.ExecContext(ctx, ob.Schema()[0])
		require.NoError(t, err)
		err = run()
		require.ErrorIs(t, err, outbox.ErrNoSchema)
		require.Contains(t, err.Error(), table+"_lease")
		require.Zero(t, logs.count(msgFailing), "a missing schema is an error, not an outage:\n%s", logs.dump())
		require.NoError(t, ob.CreateSchema(ctx))
	})
}

// waitHealthy waits until r's database calls succeed: not failing, and
// three polls without a failed call (a connection broken by a fault may
// fail once more when the pool hands it out).
func waitHealthy(t *testing.T, r *outbox.Relay) {
	t.Helper()
	for range 100 {
		before := r.Stats().DBErrors
		waitPolls(t, r, 3)
		if st := r.Stats(); st.DBErrors == before && st.DBFailingFor == 0 {
			return
		}
	}
	t.Fatalf("relay still failing: %+v", r.Stats())
}

// waitUntil polls cond every 5 ms for up to 30 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The relay's connections terminated (pg_terminate_backend) at random, one
// every 5-25 ms, while it claims, fetches, publishes, marks and listens
// (the application writing a round of events every 15 ms for about 1 s):
// every event arrives, in order, Run goes on, the failures are counted as
// connection errors, and each streak of failures is one "failing" line and
// one "recovered" line.
func TestRelayConnectionsTerminated(t *testing.T) {
	srv := dbtest.NewServer(t)
	admin := srv.Open(t)
	db := srv.Open(t, "application_name=outbox_relay")
	table := dbtest.Table(t, admin, "term")
	setup, err := outbox.New(admin, outbox.WithTable(table))
	require.NoError(t, err)
	require.NoError(t, setup.CreateSchema(context.Background()))
	const keys, perKey = 10, 60
	ob, err := outbox.New(db, outbox.WithTable(table))
	require.NoError(t, err)
	rec := newRecorder(keys * perKey)
	sink := func(ctx context.Context, e outbox.Event) error {
		time.Sleep(time.Millisecond)
		return rec.sink(ctx, e)
	}
	logs := newLogLines()
	r, err := ob.NewRelay(sink, outbox.WithLogger(slog.New(logs)), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithLeaseDuration(time.Second), outbox.WithBatchSize(50), outbox.WithKeyBatch(5))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var kills atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		rnd := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(5+rnd.IntN(20)) * time.Millisecond):
			}
			var n int
			err := admin.QueryRowContext(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE application_name = 'outbox_relay' ORDER BY random() LIMIT 1) t`).Scan(&n)
			if err != nil {
				t.Errorf("terminate: %v", err)
				return
			}
			kills.Add(int64(n))
		}
	})
	// The application writes a round (one event per key, one
	// transaction, on a connection nobody terminates) every 15 ms.
	for j := range perKey {
		tx, err := admin.BeginTx(ctx, nil)
		require.NoError(t, err)
		for k := range keys {
			_, err := setup.Write(ctx, tx, outbox.Event{Key: key(k), Payload: []byte(strconv.Itoa(j))})
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
		time.Sleep(15 * time.Millisecond)
	}
	rec.wait(t, 60*time.Second)
	close(stop)
	wg.Wait()
	waitUntil(t, "nothing pending", func() bool { return counts(t, setup)[outbox.Pending] == 0 })
	waitHealthy(t, r)
	select {
	case err := <-errc:
		t.Fatalf("Run returned: %v", err)
	default:
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	require.NoError(t, r.Close(cctx))
	require.NoError(t, <-errc)
	st := r.Stats()
	dups := rec.check(t, keys, perKey)
	failing, still, recovered := logs.count(msgFailing), logs.count(msgStill), logs.count(msgRecovered)
	t.Logf("%d backends terminated; %d duplicates; stats %+v; log lines: %d failing, %d still failing, %d recovered", kills.Load(), dups, st, failing, still, recovered)
	require.Greater(t, kills.Load(), int64(10), "connections terminated")
	require.NotZero(t, st.DBErrorKinds.Connection)
	require.Equal(t, failing, recovered, "every streak of failures ends with a recovery:\n%s", logs.dump())
	require.LessOrEqual(t, failing, int(st.DBErrors), "one line per streak, not per failed call")
}

// statement_timeout and lock_timeout hit by the relay's queries: while the
// relay publishes (keys leased, 600 ms leases), a session holds an
// exclusive lock on the lease table for 600 ms, so that every claim,
// renewal, mark and key walk waits. With lock_timeout (50 ms) they fail
// with SQLSTATE 55P03, with statement_timeout (100 ms) with 57014: both
// counted as timeouts, logged as one outage; once the lock goes, every event
// arrives in order.
func TestRelayQueryTimeouts(t *testing.T) {
	srv := dbtest.NewServer(t)
	admin := srv.Open(t)
	table := dbtest.Table(t, admin, "tmo")
	setup, err := outbox.New(admin, outbox.WithTable(table))
	require.NoError(t, err)
	require.NoError(t, setup.CreateSchema(context.Background()))
	for _, c := range []struct{ setting, code string }{
		{"lock_timeout=50", "55P03"},
		{"statement_timeout=100", "57014"},
	} {
		t.Run(strings.Split(c.setting, "=")[0], func(t *testing.T) {
			ctx := context.Background()
			const keys, perKey = 5, 20
			writeEvents(t, setup, keys, perKey, 50)
			db := srv.Open(t, "options='-c "+c.setting+"'")
			ob, err := outbox.New(db, outbox.WithTable(table))
			require.NoError(t, err)
			rec := newRecorder(keys * perKey)
			sink := func(ctx context.Context, e outbox.Event) error {
				time.Sleep(2 * time.Millisecond) // keys held when the lock comes
				return rec.sink(ctx, e)
			}
			logs := newLogLines()
			r, stop := startRelay(t, ob, sink, outbox.WithLogger(slog.New(logs)), outbox.WithPollInterval(20*time.Millisecond),
				outbox.WithLeaseDuration(600*time.Millisecond), outbox.WithKeyBatch(5))
			waitUntil(t, "deliveries", func() bool { return r.Stats().Published >= 10 })
			lock, err := admin.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer lock.Rollback()
			_, err = lock.ExecContext(ctx, `LOCK TABLE `+table+`_lease IN ACCESS EXCLUSIVE MODE`)
			require.NoError(t, err)
			polls := r.Stats().Polls
			waitUntil(t, "timeouts", func() bool { return r.Stats().DBErrorKinds.Timeout >= 3 })
			time.Sleep(600 * time.Millisecond)
			require.NoError(t, lock.Commit())
			rec.wait(t, 30*time.Second)
			waitUntil(t, "nothing pending", func() bool { return counts(t, setup)[outbox.Pending] == 0 })
			waitHealthy(t, r)
			stop()
			st := r.Stats()
			t.Logf("stats %+v", st)
			rec.check(t, keys, perKey)
			require.Equal(t, st.DBErrors, st.DBErrorKinds.Timeout, "every failure a timeout")
			require.Greater(t, st.Polls, polls+5, "the relay polled on")
			require.Equal(t, 1, logs.count(msgFailing), "one outage:\n%s", logs.dump())
			require.Equal(t, 1, logs.count(msgRecovered), "one outage:\n%s", logs.dump())
			require.Contains(t, logs.dump(), c.code)
		})
	}
}

// Write when the server goes away in the middle of the caller's
// transaction: the connection terminated between two Writes (the second
// Write fails with a connection error naming the event; Commit fails), and
// the server restarted between Write and Commit (Commit fails). Nothing of
// either transaction is ever published; an event committed afterwards is.
func TestWriteWhenServerGoesAway(t *testing.T) {
	srv := dbtest.NewServer(t)
	admin := srv.Open(t)
	db := srv.Open(t)
	ob := newOutbox(t, db)
	ctx := context.Background()

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = ob.Write(ctx, tx, outbox.Event{ID: "a1", Key: "a", Payload: []byte("0")})
	require.NoError(t, err)
	var pid int
	require.NoError(t, tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	_, err = admin.ExecContext(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	_, err = ob.Write(ctx, tx, outbox.Event{ID: "a2", Key: "a", Payload: []byte("1")})
	require.Error(t, err)
	t.Logf("Write: %v", err)
	require.Contains(t, err.Error(), `outbox: write event "a2"`)
	require.Equal(t, sqldb.KindConnection, sqldb.Classify(err), "%v", err)
	require.Error(t, tx.Commit())

	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	for _, id := range []string{"b1", "b2"} {
		_, err = ob.Write(ctx, tx, outbox.Event{ID: id, Key: "b", Payload: []byte("0")})
		require.NoError(t, err)
	}
	srv.Restart()
	err = tx.Commit()
	require.Error(t, err)
	t.Logf("Commit: %v", err)

	require.NoError(t, idemWrite(ctx, ob, "c", 0))
	rec := newRecorder(1)
	r, stop := startRelay(t, ob, rec.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond))
	rec.wait(t, 30*time.Second)
	waitPolls(t, r, 3)
	stop()
	require.Equal(t, map[string]int{"c/0": 1}, rec.ids, "only the committed event")
	c := counts(t, ob)
	require.Zero(t, c[outbox.Pending]+c[outbox.Dead]+c[outbox.Sent])
}
