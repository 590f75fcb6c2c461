package main

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keysched/keysched/db/sqldb"
)

// pgStats measures what one run costs the PostgreSQL server (--pgstats):
//
//   - WAL: the bytes between the run's first and last LSN (exact), and, with
//     the pg_walinspect extension installed in the database, the WAL
//     records of that range by type (COMMIT records, heap and B-tree
//     records: a B-tree INSERT_LEAF is one index entry written). These are
//     the whole server's: on a shared server they include other clients'.
//   - after a settle of statsSettle (PostgreSQL 15 reports an idle
//     backend's statistics within 10 s): the deltas of pg_stat_wal
//     (records, bytes, syncs), pg_stat_database.xact_commit (the database's
//     commits, read-only ones included) and pg_stat_user_tables summed over
//     the run's tables (tuples inserted, updated, HOT-updated, deleted).
//   - waits: pg_stat_activity sampled every waitSample for the backends of
//     this process's connections (application_name), each sample counting
//     each backend active (by wait event, "CPU" when none) or idle in a
//     transaction (waiting for the client).
//
// The sampling costs a query per waitSample on its own connection, alike
// for every system.
type pgStats struct {
	db      *sql.DB
	app     string
	pattern string // LIKE on schemaname.relname: the run's tables
	inspect bool

	lsn0   string
	wal0   walRow
	xact0  int64
	table0 tableRow

	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	samples int
	waits   map[string]int
}

const waitSample = 15 * time.Millisecond

// statsSettle is the wait after a run before the statistics are read (a
// variable for the test).
var statsSettle = 11 * time.Second

type walRow struct{ records, fpi, bytes, syncs int64 }

type tableRow struct{ ins, upd, hot, del int64 }

// pgDelta is one run's cost (JSON "pgstats").
type pgDelta struct {
	Events      int                `json:"events"`
	WALBytes    int64              `json:"wal_bytes_lsn"`         // between the run's first and last LSN
	WALByType   map[string]walType `json:"wal_by_type,omitempty"` // pg_walinspect, over the same range
	StatWAL     walDelta           `json:"pg_stat_wal"`           // after the settle
	XactCommits int64              `json:"xact_commit"`
	Tuples      tupleDelta         `json:"tuples"`
	WaitSamples int                `json:"wait_samples"`
	Waits       map[string]int     `json:"waits"` // backend-samples per state/wait event
}

type walType struct {
	Records int64 `json:"records"`
	Bytes   int64 `json:"bytes"` // with full-page images
}

type walDelta struct {
	Records int64 `json:"records"`
	FPI     int64 `json:"fpi"`
	Bytes   int64 `json:"bytes"`
	Syncs   int64 `json:"syncs"`
}

type tupleDelta struct {
	Inserted   int64 `json:"inserted"`
	Updated    int64 `json:"updated"`
	HotUpdated int64 `json:"hot_updated"`
	Deleted    int64 `json:"deleted"`
}

// appDSN returns dsn with application_name set to app (key=value or URL
// form).
func appDSN(dsn, app string) string {
	if strings.Contains(dsn, "://") {
		if strings.Contains(dsn, "?") {
			return dsn + "&application_name=" + app
		}
		return dsn + "?application_name=" + app
	}
	return dsn + " application_name=" + app
}

func benchAppName() string { return fmt.Sprintf("outboxbench_%d", os.Getpid()) }

func startPGStats(ctx context.Context, dsn, app, pattern string) (*pgStats, error) {
	db, err := sqldb.OpenPostgres(ctx, dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(2)
	p := &pgStats{db: db, app: app, pattern: pattern, stop: make(chan struct{}), done: make(chan struct{}), waits: map[string]int{}}
	if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_walinspect')`).Scan(&p.inspect); err != nil {
		db.Close()
		return nil, err
	}
	if err := p.snapshot(ctx, &p.lsn0, &p.wal0, &p.xact0, &p.table0); err != nil {
		db.Close()
		return nil, err
	}
	go p.sample()
	return p, nil
}

func (p *pgStats) snapshot(ctx context.Context, lsn *string, w *walRow, xact *int64, t *tableRow) error {
	return p.db.QueryRowContext(ctx, `SELECT pg_current_wal_lsn()::text,
	w.wal_records, w.wal_fpi, w.wal_bytes::bigint, w.wal_sync,
	(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
	COALESCE(SUM(t.n_tup_ins), 0)::bigint, COALESCE(SUM(t.n_tup_upd), 0)::bigint, COALESCE(SUM(t.n_tup_hot_upd), 0)::bigint, COALESCE(SUM(t.n_tup_del), 0)::bigint
	FROM pg_stat_wal AS w LEFT JOIN pg_stat_user_tables AS t ON t.schemaname || '.' || t.relname LIKE $1
	GROUP BY 1, 2, 3, 4, 5, 6`, p.pattern).Scan(lsn, &w.records, &w.fpi, &w.bytes, &w.syncs, xact, &t.ins, &t.upd, &t.hot, &t.del)
}

func (p *pgStats) sample() {
	defer close(p.done)
	tick := time.NewTicker(waitSample)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		rows, err := p.db.Query(`SELECT CASE WHEN state = 'active' THEN COALESCE(wait_event_type || ':' || wait_event, 'CPU') ELSE state END, count(*)
	FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid() AND state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')
	GROUP BY 1`, p.app)
		if err != nil {
			continue
		}
		p.mu.Lock()
		p.samples++
		for rows.Next() {
			var k string
			var n int
			if rows.Scan(&k, &n) == nil {
				p.waits[k] += n
			}
		}
		p.mu.Unlock()
		rows.Close()
	}
}

// finish ends the sampling at the run's end, reads the WAL range, waits
// statsSettle and reads the statistics' deltas.
func (p *pgStats) finish(ctx context.Context, events int) (*pgDelta, error) {
	defer p.db.Close()
	close(p.stop)
	<-p.done
	d := &pgDelta{Events: events, WaitSamples: p.samples, Waits: p.waits}
	var lsn1 string
	if err := p.db.QueryRowContext(ctx, `SELECT pg_current_wal_lsn()::text, pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, p.lsn0).Scan(&lsn1, &d.WALBytes); err != nil {
		return nil, err
	}
	if p.inspect {
		// The range ends at a flushed LSN at most (pg_walinspect reads
		// only those).
		d.WALByType = map[string]walType{}
		rows, err := p.db.QueryContext(ctx, `SELECT "resource_manager/record_type", count, combined_size FROM pg_get_wal_stats($1::pg_lsn, LEAST($2::pg_lsn, pg_current_wal_flush_lsn()), true) WHERE count > 0`, p.lsn0, lsn1)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var k string
			var w walType
			if err := rows.Scan(&k, &w.Records, &w.Bytes); err != nil {
				rows.Close()
				return nil, err
			}
			d.WALByType[k] = w
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	select {
	case <-time.After(statsSettle):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var w walRow
	var xact int64
	var t tableRow
	var lsn string
	if err := p.snapshot(ctx, &lsn, &w, &xact, &t); err != nil {
		return nil, err
	}
	d.StatWAL = walDelta{w.records - p.wal0.records, w.fpi - p.wal0.fpi, w.bytes - p.wal0.bytes, w.syncs - p.wal0.syncs}
	d.XactCommits = xact - p.xact0
	d.Tuples = tupleDelta{t.ins - p.table0.ins, t.upd - p.table0.upd, t.hot - p.table0.hot, t.del - p.table0.del}
	return d, nil
}

// String is the delta per event, one paragraph.
func (d *pgDelta) String() string {
	e := float64(d.Events)
	var b strings.Builder
	fmt.Fprintf(&b, "  pgstats per event: WAL %.0f B (LSN); pg_stat_wal %.2f records, %.0f B, %.3f FPI, %.3f syncs; xact_commit %.3f; tuples ins %.2f upd %.2f (HOT %.2f) del %.2f\n",
		float64(d.WALBytes)/e, float64(d.StatWAL.Records)/e, float64(d.StatWAL.Bytes)/e, float64(d.StatWAL.FPI)/e, float64(d.StatWAL.Syncs)/e,
		float64(d.XactCommits)/e, float64(d.Tuples.Inserted)/e, float64(d.Tuples.Updated)/e, float64(d.Tuples.HotUpdated)/e, float64(d.Tuples.Deleted)/e)
	if len(d.WALByType) > 0 {
		ks := slices.SortedFunc(maps.Keys(d.WALByType), func(a, b string) int { return int(d.WALByType[b].Bytes - d.WALByType[a].Bytes) })
		b.WriteString("  WAL records (bytes) per event, pg_walinspect:")
		for _, k := range ks {
			if w := d.WALByType[k]; float64(w.Records)/e >= 0.005 {
				fmt.Fprintf(&b, " %s %.2f (%.0f B)", k, float64(w.Records)/e, float64(w.Bytes)/e)
			}
		}
		b.WriteByte('\n')
	}
	if d.WaitSamples > 0 {
		ks := slices.SortedFunc(maps.Keys(d.Waits), func(a, b string) int { return d.Waits[b] - d.Waits[a] })
		fmt.Fprintf(&b, "  backends per sample (%d samples):", d.WaitSamples)
		for _, k := range ks {
			fmt.Fprintf(&b, " %s %.2f", k, float64(d.Waits[k])/float64(d.WaitSamples))
		}
		b.WriteByte('\n')
	}
	return b.String()
}
