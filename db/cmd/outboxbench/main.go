// Command outboxbench measures the transactional outbox: events per second
// written (outbox.Write in transactions of --per-tx events) and published
// (relay to a no-op sink, until every event was published), on SQLite and
// PostgreSQL, with 1 and 2 relays; and the relay's per-key isolation: the
// other keys' throughput while one key's sink fails, against a run where it
// does not.
//
//	go run ./db/cmd/outboxbench                      # both databases, throughput and isolation
//	go run ./db/cmd/outboxbench --db sqlite --events 50000
//	go run ./db/cmd/outboxbench --dsn 'postgres://user@host/db'
//
// PostgreSQL is reached at --dsn (default: the local socket, database
// keysched_test, as the OS user); it is skipped with a message when it cannot
// be reached. Each run uses a fresh table, dropped afterwards.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

func main() {
	var (
		which   = flag.String("db", "sqlite,postgres", "databases to measure: sqlite, postgres or both (comma-separated)")
		dsn     = flag.String("dsn", "host=/var/run/postgresql dbname=keysched_test", "PostgreSQL DSN")
		events  = flag.Int("events", 20000, "events per throughput run")
		keys    = flag.Int("keys", 500, "keys the events are spread over")
		perTx   = flag.Int("per-tx", 100, "events written per transaction")
		relays  = flag.String("relays", "1,2", "relay counts to measure (comma-separated)")
		rounds  = flag.Int("rounds", 3, "runs per configuration")
		isolate = flag.Duration("fail-for", time.Minute, "isolation run: how long key \"bad\"'s sink fails, from the relay's start (0: skip the isolation runs); the run ends when the other keys are done")
		batch   = flag.Int("batch", outbox.DefaultBatchSize, "relay batch size")
		profile = flag.String("cpuprofile", "", "write a CPU profile to this file")
		only    = flag.String("only", "", "run only the throughput or only the isolation runs")
	)
	flag.Parse()
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	ctx := context.Background()
	var relayCounts []int
	for _, s := range strings.Split(*relays, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fatal(fmt.Errorf("--relays: bad count %q", s))
		}
		relayCounts = append(relayCounts, n)
	}
	for _, name := range strings.Split(*which, ",") {
		name = strings.TrimSpace(name)
		db, cleanup, err := open(ctx, name, *dsn)
		if err != nil {
			fmt.Printf("%s: SKIPPED: %v\n", name, err)
			continue
		}
		fmt.Printf("== %s: %d events on %d keys, %d per transaction, batch %d\n", name, *events, *keys, *perTx, *batch)
		fmt.Printf("%-8s %-7s %5s %12s %12s %8s\n", "db", "relays", "round", "write ev/s", "relay ev/s", "dups")
		for _, nr := range relayCounts {
			if *only == "isolation" {
				break
			}
			for round := 1; round <= *rounds; round++ {
				w, r, dups, err := throughput(ctx, db, *events, *keys, *perTx, nr, *batch)
				if err != nil {
					fatal(err)
				}
				fmt.Printf("%-8s %-7d %5d %12.0f %12.0f %8d\n", name, nr, round, w, r, dups)
			}
		}
		if *isolate > 0 && *only != "throughput" {
			// Baseline and failing runs alternate, so that drift of this
			// shared machine hits both alike.
			var ratios []float64
			for round := 1; round <= *rounds; round++ {
				base, err := isolation(ctx, db, *events, *keys, *perTx, *batch, 0)
				if err != nil {
					fatal(err)
				}
				failing, err := isolation(ctx, db, *events, *keys, *perTx, *batch, *isolate)
				if err != nil {
					fatal(err)
				}
				ratios = append(ratios, failing.rate/base.rate)
				fmt.Printf("%-8s isolation round %d: other keys %0.f ev/s while key \"bad\" fails (%d sink calls, all failed: %v), %0.f ev/s when it does not: ratio %.2f\n",
					name, round, failing.rate, failing.badCalls, failing.stillFailing, base.rate, failing.rate/base.rate)
			}
			slices.Sort(ratios)
			fmt.Printf("%-8s isolation: median ratio %.2f over %d rounds\n", name, ratios[len(ratios)/2], len(ratios))
		}
		cleanup()
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "outboxbench:", err)
	os.Exit(1)
}

var tables atomic.Int64

func open(ctx context.Context, name, dsn string) (*sql.DB, func(), error) {
	switch name {
	case "sqlite":
		dir, err := os.MkdirTemp("", "outboxbench")
		if err != nil {
			return nil, nil, err
		}
		db, err := sqldb.OpenSQLite(filepath.Join(dir, "bench.db"))
		if err != nil {
			return nil, nil, err
		}
		return db, func() { db.Close(); os.RemoveAll(dir) }, nil
	case "postgres":
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		db, err := sqldb.OpenPostgres(cctx, dsn)
		if err != nil {
			return nil, nil, err
		}
		db.SetMaxOpenConns(32)
		return db, func() { db.Close() }, nil
	}
	return nil, nil, fmt.Errorf("unknown database %q (sqlite or postgres)", name)
}

func newOutbox(ctx context.Context, db *sql.DB) (*outbox.Outbox, func(), error) {
	name := fmt.Sprintf("outboxbench_%d_%d", os.Getpid(), tables.Add(1))
	ob, err := outbox.New(db, outbox.WithTable(name))
	if err != nil {
		return nil, nil, err
	}
	if err := ob.CreateSchema(ctx); err != nil {
		return nil, nil, err
	}
	drop := func() {
		// Best effort: a table left behind is named for this run only.
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+name)
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+name+"_lease")
		if ob.Dialect() == outbox.Postgres {
			_, _ = db.ExecContext(ctx, "DROP FUNCTION IF EXISTS "+name+"_notify() CASCADE")
		}
	}
	return ob, drop, nil
}

// write writes n events over keys keys (plus, first, bad events on key
// "bad"), perTx per transaction, and returns the events per second.
func write(ctx context.Context, ob *outbox.Outbox, n, keys, perTx, bad int) (float64, error) {
	start := time.Now()
	var tx *sql.Tx
	written := 0
	payload := []byte(`{"amount":100,"currency":"EUR"}`)
	emit := func(key string) error {
		if tx == nil {
			var err error
			if tx, err = ob.DB().BeginTx(ctx, nil); err != nil {
				return err
			}
		}
		if _, err := ob.Write(ctx, tx, outbox.Event{Key: key, Type: "deposit", Payload: payload}); err != nil {
			return err
		}
		if written++; written%perTx == 0 {
			err := tx.Commit()
			tx = nil
			return err
		}
		return nil
	}
	for i := 0; i < bad; i++ {
		if err := emit("bad"); err != nil {
			return 0, err
		}
	}
	for i := 0; i < n; i++ {
		if err := emit(fmt.Sprintf("key-%04d", i%keys)); err != nil {
			return 0, err
		}
	}
	if tx != nil {
		if err := tx.Commit(); err != nil {
			return 0, err
		}
	}
	return float64(written) / time.Since(start).Seconds(), nil
}

var quiet = slog.New(slog.DiscardHandler)

// throughput writes a backlog of n events, then runs nr relays with a no-op
// sink until every event was published.
func throughput(ctx context.Context, db *sql.DB, n, keys, perTx, nr, batch int) (writeRate, relayRate float64, dups int, err error) {
	ob, drop, err := newOutbox(ctx, db)
	if err != nil {
		return 0, 0, 0, err
	}
	defer drop()
	if writeRate, err = write(ctx, ob, n, keys, perTx, 0); err != nil {
		return 0, 0, 0, err
	}
	var calls atomic.Int64
	done := make(chan struct{})
	sink := func(ctx context.Context, e outbox.Event) error {
		if calls.Add(1) == int64(n) {
			close(done)
		}
		return nil
	}
	start := time.Now()
	stop, err := startRelays(ctx, ob, sink, nr, batch)
	if err != nil {
		return 0, 0, 0, err
	}
	<-done
	elapsed := time.Since(start)
	if err := stop(ctx); err != nil {
		return 0, 0, 0, err
	}
	return writeRate, float64(n) / elapsed.Seconds(), int(calls.Load()) - n, nil
}

func startRelays(ctx context.Context, ob *outbox.Outbox, sink outbox.Sink, nr, batch int, opts ...outbox.RelayOption) (stop func(context.Context) error, err error) {
	var rs []*outbox.Relay
	var wg sync.WaitGroup
	errs := make(chan error, nr)
	for i := 0; i < nr; i++ {
		r, err := ob.NewRelay(sink, append([]outbox.RelayOption{outbox.WithLogger(quiet), outbox.WithBatchSize(batch), outbox.WithPollInterval(20 * time.Millisecond)}, opts...)...)
		if err != nil {
			return nil, err
		}
		rs = append(rs, r)
		wg.Add(1)
		go func() { defer wg.Done(); errs <- r.Run(ctx) }()
	}
	return func(cctx context.Context) error {
		var all []error
		for _, r := range rs {
			all = append(all, r.Close(cctx))
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			all = append(all, e)
		}
		return errors.Join(all...)
	}, nil
}

type isoResult struct {
	rate         float64
	badCalls     int64
	stillFailing bool
}

// isolation writes 1,000 events of key "bad" (the oldest rows) and n events
// on keys keys, and runs one relay whose sink fails every call of key "bad"
// for failFor (retried with backoff from 10 ms to 100 ms). It returns the
// other keys' events per second until all of them were published.
func isolation(ctx context.Context, db *sql.DB, n, keys, perTx, batch int, failFor time.Duration) (isoResult, error) {
	ob, drop, err := newOutbox(ctx, db)
	if err != nil {
		return isoResult{}, err
	}
	defer drop()
	if _, err := write(ctx, ob, n, keys, perTx, 1000); err != nil {
		return isoResult{}, err
	}
	var others, badCalls atomic.Int64
	done := make(chan struct{})
	start := time.Now()
	errDown := errors.New("endpoint down")
	sink := func(ctx context.Context, e outbox.Event) error {
		if e.Key == "bad" {
			badCalls.Add(1)
			if time.Since(start) < failFor {
				return errDown
			}
			return nil
		}
		if others.Add(1) == int64(n) {
			close(done)
		}
		return nil
	}
	stop, err := startRelays(ctx, ob, sink, 1, batch,
		outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 1 << 30, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}))
	if err != nil {
		return isoResult{}, err
	}
	<-done
	elapsed := time.Since(start)
	still := elapsed < failFor
	// The failing key's rows are still retrying: give them back.
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := stop(cctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return isoResult{}, err
	}
	return isoResult{rate: float64(n) / elapsed.Seconds(), badCalls: badCalls.Load(), stillFailing: still}, nil
}
