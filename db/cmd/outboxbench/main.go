// Command outboxbench puts keysched's transactional outbox next to its rivals
// doing the same job on the same database: River (transactional enqueue of a
// job, a worker delivers it) and Watermill (the SQL publisher on the
// application's transaction with its forwarder component). An application
// writes N events over K keys in transactions of a few events while the
// consumers (the outbox's relays, River clients, Watermill forwarders) run;
// each event goes to one sink. Per system and consumer count it reports the
// events per second written and delivered, the p50/p99 from commit to first
// delivery, per-key order violations (an event delivered after a later event
// of its key), duplicates, and, in a second run, what one key's sink failing
// for the whole run does to the other keys' throughput.
//
//	go run ./db/cmd/outboxbench                                  # both databases, all systems
//	go run ./db/cmd/outboxbench --db sqlite --events 20000 --json
//	go run ./db/cmd/outboxbench --db postgres --dsn 'postgres://user@host/db' --systems keysched,river
//	go run ./db/cmd/outboxbench --db postgres --systems keysched,watermill --only throughput --pgstats
//
// --pgstats prints, after each PostgreSQL run, what it cost the server per
// event: WAL bytes (and records by type with the pg_walinspect extension),
// WAL syncs, commits, the run's tables' tuple writes and where its backends
// waited (pgstats.go). The WAL and commit figures are the whole server's:
// run it on a server of its own.
//
// --retention d runs the outbox's relays with outbox.WithRetention(d): they
// mark published rows sent (an UPDATE) instead of deleting them.
//
// --notify=false runs the outbox without its NOTIFY trigger (relays poll
// only); --notify-from-write runs it with outbox.WithNotifyFromWrite (no
// trigger: Write's INSERT notifies idle relays itself).
//
// PostgreSQL is reached at --dsn (default: the local socket, database
// keysched_test, as the OS user); it is skipped with a message when it cannot
// be reached. SQLite is a fresh WAL file per run in a temporary directory.
// Each run uses fresh tables (a fresh schema for River), dropped afterwards.
// Watermill runs on PostgreSQL only: watermill-sql has no SQLite adapter.
//
// The program is a module of its own so that the db module's users do not
// download River and Watermill.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keysched/keysched/db/outbox"
)

type config struct {
	dbs, systems []string
	dsn          string
	wl           workload
	consumers    []int
	rounds       int
	batch        int
	isolation    bool
	only         string
	json         bool
	notify       bool
	notifyWrite  bool
	pgstats      bool
	retention    time.Duration
}

func main() {
	if err := mainErr(context.Background(), os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h: the usage is printed
		}
		fmt.Fprintln(os.Stderr, "outboxbench:", err)
		os.Exit(1)
	}
}

func mainErr(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("outboxbench", flag.ContinueOnError)
	var (
		which   = fs.String("db", "sqlite,postgres", "databases to measure: sqlite, postgres or both (comma-separated)")
		dsn     = fs.String("dsn", "host=/var/run/postgresql dbname=keysched_test", "PostgreSQL DSN")
		systems = fs.String("systems", "keysched,river,watermill", "systems to measure (comma-separated): keysched (the outbox's relays), river, watermill")
		events  = fs.Int("events", 10000, "events per run")
		keys    = fs.Int("keys", 100, "keys the events are spread over (event i has key i mod keys)")
		perTx   = fs.Int("per-tx", 5, "events written per transaction")
		backlog = fs.Bool("backlog", false, "write every event before the consumers start: the delivery rate is the consumers' alone (from their start), commit-to-delivery includes the wait")
		writers = fs.Int("writers", 4, "concurrent writers (each writes its keys' events in order, in its own transactions)")
		relays  = fs.String("relays", "1,2", "consumer counts to measure (relays, River clients, forwarders; comma-separated)")
		rounds  = fs.Int("rounds", 3, "runs per configuration (the summary gives medians)")
		timeout = fs.Duration("timeout", 2*time.Minute, "a run's limit: a run that has not delivered every awaited event by then ends and is marked timed out")
		isolate = fs.Bool("isolation", true, "after each healthy run, a run where key 0's sink fails for the whole run")
		batch   = fs.Int("batch", outbox.DefaultBatchSize, "outbox relay batch size")
		profile = fs.String("cpuprofile", "", "write a CPU profile to this file")
		only    = fs.String("only", "", "run only the healthy (\"throughput\") or only the failing-key (\"isolation\") runs")
		asJSON  = fs.Bool("json", false, "print one JSON object per run and per summary row, one a line, instead of the tables")
		pgstats = fs.Bool("pgstats", false, "PostgreSQL: after each run, what it cost the server per event (WAL bytes and records, syncs, commits, the run's tables' tuple writes, where its backends waited); each run then waits 11 s more for the server's statistics (see pgstats.go)")
		retain  = fs.Duration("retention", 0, "keysched: outbox.WithRetention for the relays (published rows marked sent by an UPDATE and kept this long; 0: deleted when published, the default)")
		notify  = fs.Bool("notify", true, "keysched on PostgreSQL: the outbox's NOTIFY trigger and its relays' LISTEN (false: outbox.WithNotify(false), relays poll every 20 ms)")
		fromW   = fs.Bool("notify-from-write", false, "keysched on PostgreSQL: outbox.WithNotifyFromWrite (no trigger: Write's INSERT notifies idle relays itself; relays LISTEN); not with --notify=false")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (every setting is a flag; -h lists them)", fs.Arg(0))
	}
	cfg := config{dsn: *dsn, rounds: *rounds, batch: *batch, isolation: *isolate, only: *only, json: *asJSON, notify: *notify, notifyWrite: *fromW, pgstats: *pgstats, retention: *retain,
		wl: workload{events: *events, keys: *keys, perTx: *perTx, writers: *writers, backlog: *backlog, timeout: *timeout}}
	switch {
	case *events < 1, *keys < 2, *perTx < 1, *writers < 1, *rounds < 1, *batch < 1, *timeout <= 0, *retain < 0:
		return errors.New("--events, --per-tx, --writers, --rounds and --batch must be at least 1, --keys at least 2, --timeout positive, --retention not negative")
	case *fromW && !*notify:
		return errors.New("--notify-from-write: not with --notify=false (no notification at all)")
	case *only != "" && *only != "throughput" && *only != "isolation":
		return fmt.Errorf("--only: %q is neither throughput nor isolation", *only)
	}
	for _, s := range strings.Split(*relays, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("--relays: bad count %q", s)
		}
		cfg.consumers = append(cfg.consumers, n)
	}
	for _, s := range strings.Split(*systems, ",") {
		s = strings.TrimSpace(s)
		if _, ok := constructors[s]; !ok {
			return fmt.Errorf("--systems: unknown system %q (keysched, river, watermill)", s)
		}
		cfg.systems = append(cfg.systems, s)
	}
	for _, s := range strings.Split(*which, ",") {
		s = strings.TrimSpace(s)
		if s != "sqlite" && s != "postgres" {
			return fmt.Errorf("--db: unknown database %q (sqlite, postgres)", s)
		}
		cfg.dbs = append(cfg.dbs, s)
	}
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	return bench(ctx, cfg, out)
}

var constructors = map[string]func(ctx context.Context, env *dbEnv, keys, batch int) (system, error){
	"keysched": newOutboxSystem,
	"river": func(ctx context.Context, env *dbEnv, keys, _ int) (system, error) {
		return newRiverSystem(ctx, env, keys)
	},
	"watermill": func(ctx context.Context, env *dbEnv, keys, _ int) (system, error) {
		return newWatermillSystem(ctx, env, keys)
	},
}

func systemLabel(name string) string {
	if name == "keysched" {
		return "keysched outbox"
	}
	return name
}

// summary is the median over rounds of one configuration.
type summary struct {
	Kind            string  `json:"kind"` // "summary"
	DB              string  `json:"db"`
	System          string  `json:"system"`
	Consumers       int     `json:"consumers"`
	Rounds          int     `json:"rounds"`
	WriteRate       float64 `json:"write_events_per_s"`
	DeliverRate     float64 `json:"delivered_events_per_s"`
	P50ms           float64 `json:"commit_to_delivery_p50_ms"`
	P99ms           float64 `json:"commit_to_delivery_p99_ms"`
	OrderViolations int64   `json:"order_violations"` // summed over the healthy rounds
	Duplicates      int64   `json:"duplicates"`       // summed over all rounds
	OtherHealthy    float64 `json:"other_keys_events_per_s_healthy"`
	OtherFailing    float64 `json:"other_keys_events_per_s_failing"`
	IsolationRatio  float64 `json:"isolation_ratio"` // median of failing/healthy per round
	FailingRuns     int     `json:"failing_runs"`    // 0: no isolation runs (the three fields above are then 0)
	FailingTimedOut int     `json:"failing_runs_timed_out"`
	Load1           float64 `json:"load_avg_1m"`
}

func bench(ctx context.Context, cfg config, out io.Writer) error {
	enc := json.NewEncoder(out)
	var sums []summary
	if !cfg.json {
		shape := "written while the consumers run"
		fromWrite := ""
		if cfg.notifyWrite {
			fromWrite = " (from Write, no trigger)"
		}
		if cfg.wl.backlog {
			shape = "written before the consumers start (--backlog)"
		}
		fmt.Fprintf(out, "outboxbench: %d events on %d keys, %d per transaction, %d writers, %s; consumers %v, %d rounds; outbox notify %v%s, retention %v; load average %s\n",
			cfg.wl.events, cfg.wl.keys, cfg.wl.perTx, cfg.wl.writers, shape, cfg.consumers, cfg.rounds, cfg.notify, fromWrite, cfg.retention, loadavg())
		fmt.Fprintf(out, "%-8s %-16s %4s %-15s %5s %10s %10s %10s %8s %8s %6s %6s %5s\n",
			"db", "system", "cons", "scenario", "round", "write/s", "deliv/s", "others/s", "p50 ms", "p99 ms", "viol", "dups", "load")
	}
	// A database that cannot be opened, or a system it has no adapter
	// for, is skipped (a machine without PostgreSQL still measures
	// SQLite); a run that measured nothing at all is an error.
	var skipped []string
	skip := func(dbName, sysName string, err error) {
		skipped = append(skipped, strings.TrimSpace(dbName+" "+sysName)+": "+err.Error())
		if cfg.json {
			_ = enc.Encode(map[string]string{"kind": "skipped", "db": dbName, "system": sysName, "reason": err.Error()})
		} else if sysName == "" {
			fmt.Fprintf(out, "%s: SKIPPED: %v\n", dbName, err)
		} else {
			fmt.Fprintf(out, "%-8s %-16s SKIPPED: %v\n", dbName, sysName, err)
		}
	}
	for _, dbName := range cfg.dbs {
		env, cleanup, err := newEnv(ctx, dbName, cfg.dsn)
		if err != nil {
			skip(dbName, "", err)
			continue
		}
		env.noNotify = !cfg.notify
		env.notifyWrite = cfg.notifyWrite
		env.retention = cfg.retention
		if cfg.pgstats && env.name == "postgres" {
			// The runs' connections, told apart in pg_stat_activity.
			env.dsn = appDSN(env.dsn, benchAppName())
		}
		for _, sysName := range cfg.systems {
			for _, n := range cfg.consumers {
				s, err := benchOne(ctx, cfg, env, sysName, n, out, enc)
				if errors.Is(err, errNoWatermillSQLite) {
					skip(dbName, sysName, err)
					break
				}
				if err != nil {
					cleanup()
					return fmt.Errorf("%s %s %d: %w", dbName, sysName, n, err)
				}
				sums = append(sums, s)
			}
		}
		cleanup()
	}
	if len(sums) == 0 {
		return fmt.Errorf("nothing measured: %s", strings.Join(skipped, "; "))
	}
	if cfg.json {
		for _, s := range sums {
			if err := enc.Encode(s); err != nil {
				return err
			}
		}
		return nil
	}
	fmt.Fprintf(out, "\nmedians over rounds (load average now %s):\n", loadavg())
	fmt.Fprintf(out, "%-8s %-16s %4s %10s %10s %8s %8s %6s %6s %12s %12s %6s\n",
		"db", "system", "cons", "write/s", "deliv/s", "p50 ms", "p99 ms", "viol", "dups", "others ok/s", "others 1bad/s", "ratio")
	for _, s := range sums {
		iso := fmt.Sprintf("%12.0f %12.0f %6.2f", s.OtherHealthy, s.OtherFailing, s.IsolationRatio)
		if s.FailingRuns == 0 {
			iso = fmt.Sprintf("%12.0f %12s %6s", s.OtherHealthy, "-", "-")
		}
		fmt.Fprintf(out, "%-8s %-16s %4d %10.0f %10.0f %8.1f %8.1f %6d %6d %s\n",
			s.DB, s.System, s.Consumers, s.WriteRate, s.DeliverRate, s.P50ms, s.P99ms, s.OrderViolations, s.Duplicates, iso)
	}
	return nil
}

// benchOne runs rounds of one configuration: a healthy run and (with
// isolation) a failing-key run, the pair's order swapped every other round,
// so that the drift of a shared machine and a warm-up hit both alike.
func benchOne(ctx context.Context, cfg config, env *dbEnv, sysName string, n int, out io.Writer, enc *json.Encoder) (summary, error) {
	s := summary{Kind: "summary", DB: env.name, System: systemLabel(sysName), Consumers: n, Rounds: cfg.rounds}
	var write, deliv, p50, p99, okOthers, badOthers, ratios, loads []float64
	for round := 1; round <= cfg.rounds; round++ {
		var healthy, failed result
		order := []bool{false, true}
		if round%2 == 0 {
			order = []bool{true, false} // the first run of a pair is not always the same scenario
		}
		for _, failing := range order {
			if (failing && (!cfg.isolation || cfg.only == "throughput")) || (!failing && cfg.only == "isolation") {
				continue
			}
			sys, err := constructors[sysName](ctx, env, cfg.wl.keys, cfg.batch)
			if err != nil {
				return s, err
			}
			wl := cfg.wl
			wl.failing = failing
			var ps *pgStats
			if cfg.pgstats && env.name == "postgres" {
				if ps, err = startPGStats(ctx, cfg.dsn, benchAppName(), sys.tables()); err != nil {
					sys.close()
					return s, fmt.Errorf("pgstats: %w", err)
				}
			}
			r, err := run(ctx, sys, wl, n)
			if ps != nil {
				d, perr := ps.finish(ctx, wl.events)
				if err == nil && perr != nil {
					err = fmt.Errorf("pgstats: %w", perr)
				}
				r.PG = d
			}
			sys.close()
			if err != nil {
				return s, err
			}
			r.DB, r.System, r.Round, r.Load1 = env.name, s.System, round, load1()
			loads = append(loads, r.Load1)
			if cfg.json {
				if err := enc.Encode(struct {
					Kind string `json:"kind"`
					result
				}{"run", r}); err != nil {
					return s, err
				}
			} else {
				fmt.Fprintf(out, "%-8s %-16s %4d %-15s %5d %10.0f %10.0f %10.0f %8.1f %8.1f %6d %6d %5.1f%s\n",
					r.DB, r.System, n, r.Scenario, round, r.WriteRate, r.DeliverRate, r.OtherRate, r.P50ms, r.P99ms,
					r.OrderViolations, r.Duplicates, r.Load1, timedOut(r))
				if r.PG != nil {
					fmt.Fprint(out, r.PG.String())
				}
			}
			s.Duplicates += r.Duplicates
			if !failing {
				healthy = r
				write, deliv, p50, p99 = append(write, r.WriteRate), append(deliv, r.DeliverRate), append(p50, r.P50ms), append(p99, r.P99ms)
				okOthers = append(okOthers, r.OtherRate)
				s.OrderViolations += r.OrderViolations
			} else {
				failed = r
				s.FailingRuns++
				badOthers = append(badOthers, r.OtherRate)
				if r.TimedOut {
					s.FailingTimedOut++
				}
			}
		}
		if healthy.OtherRate > 0 && failed.Scenario != "" {
			ratios = append(ratios, failed.OtherRate/healthy.OtherRate)
		}
	}
	s.WriteRate, s.DeliverRate, s.P50ms, s.P99ms = median(write), median(deliv), median(p50), median(p99)
	s.OtherHealthy, s.OtherFailing, s.IsolationRatio, s.Load1 = median(okOthers), median(badOthers), median(ratios), median(loads)
	return s, nil
}

func timedOut(r result) string {
	if r.TimedOut {
		return fmt.Sprintf("  TIMED OUT: %d of %d awaited events delivered", r.Delivered, r.Awaited)
	}
	return ""
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[len(xs)/2]
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func load1() float64 {
	f, _ := strconv.ParseFloat(strings.Fields(loadavg() + " 0")[0], 64)
	return f
}
