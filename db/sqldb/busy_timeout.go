package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"modernc.org/sqlite"
)

// A Queryer runs a query returning one row: a *sql.DB, *sql.Conn or
// *sql.Tx (a *sql.DB runs it on any connection of its pool).
type Queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// NoBusyTimeoutAdvice says what to do about a SQLite database opened
// without a busy timeout (a plain sql.Open("sqlite", path)).
const NoBusyTimeoutAdvice = "the SQLite connection has no busy timeout (PRAGMA busy_timeout is 0), so a writer that finds the database locked fails at once with SQLITE_BUSY instead of waiting its turn: open the database with sqldb.OpenSQLite, or put _pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate in the DSN (a PRAGMA run with Exec reaches one pooled connection only)"

// SQLiteBusyTimeout returns the busy timeout of the SQLite connection q
// runs on (PRAGMA busy_timeout; 0 when none was set), and whether that
// connection's main database is in a file: false for an in-memory one
// (":memory:", each connection its own database, nothing to wait for). Call
// it on SQLite only: on PostgreSQL it fails.
func SQLiteBusyTimeout(ctx context.Context, q Queryer) (timeout time.Duration, file bool, err error) {
	var ms int64
	if err := q.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&ms); err != nil {
		return 0, false, fmt.Errorf("sqldb: PRAGMA busy_timeout: %w", err)
	}
	var seq int
	var name, path string
	if err := q.QueryRowContext(ctx, `SELECT seq, name, file FROM pragma_database_list WHERE name = 'main'`).Scan(&seq, &name, &path); err != nil {
		return 0, false, fmt.Errorf("sqldb: PRAGMA database_list: %w", err)
	}
	return time.Duration(ms) * time.Millisecond, path != "", nil
}

// NoBusyTimeout reports whether q's SQLite connection is on a database in a
// file and has no busy timeout; false when it cannot tell (the query
// failed).
func NoBusyTimeout(ctx context.Context, q Queryer) bool {
	t, file, err := SQLiteBusyTimeout(ctx, q)
	return err == nil && file && t == 0
}

// BusySnapshotAdvice says what to do about SQLITE_BUSY_SNAPSHOT: a
// deferred transaction that read, in WAL mode, before another connection
// committed a write, cannot write; no busy timeout makes it wait.
const BusySnapshotAdvice = "SQLITE_BUSY_SNAPSHOT: the transaction read the database before another connection wrote to it, so it cannot write, and a busy timeout does not help: roll it back and run it again, and begin write transactions IMMEDIATE so that they take the write lock first (open the database with sqldb.OpenSQLite, or put _txlock=immediate in the DSN)"

// WithBusyTimeoutAdvice returns err with NoBusyTimeoutAdvice added to its
// text when err is SQLite's SQLITE_BUSY ("database is locked") and the
// connection q runs on (the one that failed: pass the transaction) has no
// busy timeout on a file database, with BusySnapshotAdvice when err is
// SQLITE_BUSY_SNAPSHOT (code 517, which a busy timeout cannot help);
// otherwise err itself. The result wraps err (errors.Is, errors.As and
// Classify see through it). It asks q only for a SQLITE_BUSY error other
// than SQLITE_BUSY_SNAPSHOT: a cost on that error path alone.
func WithBusyTimeoutAdvice(ctx context.Context, q Queryer, err error) error {
	var sqErr *sqlite.Error
	if err == nil || !errors.As(err, &sqErr) || sqErr.Code()&0xff != 5 { // SQLITE_BUSY
		return err
	}
	if sqErr.Code() == 517 { // SQLITE_BUSY_SNAPSHOT
		return fmt.Errorf("%w (%s)", err, BusySnapshotAdvice)
	}
	if !NoBusyTimeout(ctx, q) {
		return err
	}
	return fmt.Errorf("%w (%s)", err, NoBusyTimeoutAdvice)
}
