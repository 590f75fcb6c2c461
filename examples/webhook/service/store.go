package service

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// Default table names. IntakeTable holds the intake records: one row per
// accepted event, written in the same transaction as its outbox row, and
// kept after delivery (what was accepted, from whom, when). OutboxTable is
// the db/outbox table (its relay's lease table is OutboxTable+"_lease").
// AttemptTable holds every delivery attempt (Config.History), ReplayTable
// every replay an operator asked for (Service.Replay).
const (
	IntakeTable  = "webhook_intake"
	OutboxTable  = "webhook_outbox"
	AttemptTable = "webhook_attempt"
	ReplayTable  = "webhook_replay"
)

var tablePrefixRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,31}$`)

// A StoreOption configures a Store.
type StoreOption func(*storeConfig)

type storeConfig struct{ prefix string }

// WithTablePrefix names the store's tables prefix+"outbox", prefix+"intake",
// prefix+"attempt" and prefix+"replay" instead of the defaults ("webhook_"): several services, or
// tests, can then share one database. The prefix is lower-case letters,
// digits and underscores.
func WithTablePrefix(prefix string) StoreOption {
	return func(c *storeConfig) { c.prefix = prefix }
}

// Store is the service's database: the outbox (package db/outbox) and the
// intake records. It is safe for concurrent use. One database may hold one
// service's tables.
//
// The zero Store is not usable: use NewStore, OpenSQLite or OpenPostgres.
// Close on a nil or zero Store returns ErrZeroStore, Outbox returns nil.
type Store struct {
	db      *sql.DB
	ob      *outbox.Outbox
	intake  string // the intake table's name
	attempt string // the attempt history's table (history.go)
	replay  string // the replays' table (events.go)
	ownsDB  bool
	lock    *os.File // OpenSQLite's lock file (sqlitelock.go), closed by Close
}

// OpenSQLite opens (creating it if missing) a SQLite database file and its
// tables. The driver is pure Go (modernc.org/sqlite): no cgo, no server.
//
// One process per SQLite file: OpenSQLite takes an exclusive advisory lock
// (flock) on the file path+".lock" (created if missing, left in place) and
// holds it until Close; while another Store, in this process or another,
// holds it, OpenSQLite fails at once with ErrSQLiteInUse naming the file
// and the holder's pid. (A second process used to start and take the
// first one's partner leases over.) The kernel drops the lock when its
// process dies. On platforms without flock (not Linux, macOS or the BSDs)
// nothing is locked. A *sql.DB given to NewStore is not locked.
func OpenSQLite(ctx context.Context, path string, opts ...StoreOption) (*Store, error) {
	db, err := sqldb.OpenSQLite(path)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	lock, err := lockSQLite(ctx, db)
	if err != nil {
		db.Close()
		return nil, err
	}
	s, err := NewStore(ctx, db, opts...)
	if err != nil {
		db.Close()
		if lock != nil {
			lock.Close()
		}
		return nil, err
	}
	s.ownsDB, s.lock = true, lock
	return s, nil
}

// OpenPostgres opens a PostgreSQL database (a postgres:// URL or key=value
// DSN) and creates the tables if missing.
func OpenPostgres(ctx context.Context, dsn string, opts ...StoreOption) (*Store, error) {
	db, err := sqldb.OpenPostgres(ctx, dsn)
	if err != nil {
		return nil, err
	}
	s, err := NewStore(ctx, db, opts...)
	if err != nil {
		db.Close()
		return nil, err
	}
	s.ownsDB = true
	return s, nil
}

// NewStore uses db (SQLite through modernc.org/sqlite or PostgreSQL through
// pgx's stdlib driver) and creates the outbox's and the intake's tables if
// missing (explicitly, here, at start; never during a request). Close does
// not close a db given here.
func NewStore(ctx context.Context, db *sql.DB, opts ...StoreOption) (*Store, error) {
	cfg := storeConfig{prefix: "webhook_"}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil StoreOption", ErrInvalidConfig)
		}
		o(&cfg)
	}
	if !tablePrefixRe.MatchString(cfg.prefix) {
		return nil, fmt.Errorf("%w: table prefix %q: need [a-z_][a-z0-9_]{0,31}", ErrInvalidConfig, cfg.prefix)
	}
	intake := cfg.prefix + "intake"
	ob, err := outbox.New(db, outbox.WithTable(cfg.prefix+"outbox"))
	if err != nil {
		return nil, fmt.Errorf("webhook: outbox: %w", err)
	}
	if err := ob.CreateSchema(ctx); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+intake+` (
	id          TEXT PRIMARY KEY,
	partner     TEXT NOT NULL,
	type        TEXT NOT NULL,
	received_at BIGINT NOT NULL
)`); err != nil {
		return nil, fmt.Errorf("webhook: create %s: %w", intake, err)
	}
	st := &Store{db: db, ob: ob, intake: intake, attempt: cfg.prefix + "attempt", replay: cfg.prefix + "replay"}
	if err := st.historyTables(ctx); err != nil {
		return nil, err
	}
	return st, nil
}

// Outbox returns the store's outbox.
func (s *Store) Outbox() *outbox.Outbox {
	if s.zero() {
		return nil
	}
	return s.ob
}

// zero reports a nil Store or one not made by NewStore.
func (s *Store) zero() bool { return s == nil || s.ob == nil }

// Close closes the database if the Store opened it.
func (s *Store) Close() error {
	if s.zero() {
		return ErrZeroStore
	}
	if s.ownsDB {
		err := s.db.Close()
		if s.lock != nil {
			// After the database: the next process opens it once we
			// are done with it.
			err = errors.Join(err, s.lock.Close())
		}
		return err
	}
	return nil
}

func (s *Store) rebind(q string) string { return sqldb.Rebind(s.ob.Dialect(), q) }

// acceptBatch writes each event's outbox row and intake record, all in one
// transaction: all or none.
func (s *Store) acceptBatch(ctx context.Context, batch []*acceptReq) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	insert := s.rebind(`INSERT INTO ` + s.intake + ` (id, partner, type, received_at) VALUES (?, ?, ?, ?)`)
	for _, r := range batch {
		env := r.env
		if _, err := s.ob.Write(ctx, tx, outbox.Event{
			ID: env.ID, Key: env.Partner, Type: env.Type, Payload: r.payload, CreatedAt: env.Received,
		}); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, insert, env.ID, env.Partner, env.Type, env.Received.UnixMicro()); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// loadPending fills b with the events accepted and not yet delivered (nor
// skipped), and the replays not yet delivered: outbox rows pending or dead,
// in outbox order.
func (s *Store) loadPending(ctx context.Context, b *backlog) error {
	rows, err := s.db.QueryContext(ctx, `SELECT id, partner, at FROM (
SELECT i.id, i.partner, i.received_at AS at, o.seq FROM `+s.intake+` i
JOIN `+s.ob.Table()+` o ON o.id = i.id WHERE o.state IN (0, 2)
UNION ALL
SELECT r.row_id, r.partner, r.requested_at, o.seq FROM `+s.replay+` r
JOIN `+s.ob.Table()+` o ON o.id = r.row_id WHERE o.state IN (0, 2)
) p ORDER BY seq`)
	if err != nil {
		return fmt.Errorf("webhook: loading the backlog: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, partner string
		var us int64
		if err := rows.Scan(&id, &partner, &us); err != nil {
			return fmt.Errorf("webhook: loading the backlog: %w", err)
		}
		b.load(partner, id, time.UnixMicro(us))
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("webhook: loading the backlog: %w", err)
	}
	return nil
}

// parkedHead is a parked partner's head: its oldest dead outbox row, and
// the event it delivers (the row's own ID, or a replay's event).
type parkedHead struct{ row, event string }

// parkedHeads returns each parked partner's head (one query, by the outbox's
// index of dead rows).
func (s *Store) parkedHeads(ctx context.Context) (map[string]parkedHead, error) {
	t := s.ob.Table()
	rows, err := s.db.QueryContext(ctx, `SELECT o.key, o.id, COALESCE(r.event_id, o.id) FROM `+t+` o
LEFT JOIN `+s.replay+` r ON r.row_id = o.id
WHERE o.state = 2 AND NOT EXISTS (SELECT 1 FROM `+t+` x WHERE x.key = o.key AND x.state = 2 AND x.seq < o.seq)`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]parkedHead{}
	for rows.Next() {
		var p string
		var h parkedHead
		if err := rows.Scan(&p, &h.row, &h.event); err != nil {
			return nil, err
		}
		out[p] = h
	}
	return out, rows.Err()
}
