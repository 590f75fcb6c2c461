// Package inbox makes event consumers idempotent on a real database, two
// ways:
//
//   - Inbox records each handled event's ID in the same transaction as the
//     event's effect: Apply runs the effect only for an ID not yet recorded,
//     so a redelivered event (at-least-once delivery: a retry, a relay that
//     died before marking an event sent, a consumer that crashed before
//     committing its offset) changes nothing the second time.
//   - Versions gates a write on the entity's version: an event carrying a
//     version not newer than the one stored for its entity is ignored. That
//     absorbs duplicates and out-of-order redeliveries with one row per
//     entity, no table of event IDs, nothing to expire.
//
// Both run on SQLite (modernc.org/sqlite) and PostgreSQL (pgx's
// database/sql driver); the tables are created explicitly, with CreateSchema
// or the SQL that Schema returns.
package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/schemacheck"
	"github.com/keysched/keysched/db/sqldb"
	"github.com/keysched/keysched/internal/optcheck"
	"github.com/keysched/keysched/internal/opterror"
)

// Dialect names the database. See the constants.
type Dialect = sqldb.Dialect

// The dialects; Auto (the default) finds out from the *sql.DB's driver.
const (
	Auto     = sqldb.Auto
	Postgres = sqldb.Postgres
	SQLite   = sqldb.SQLite
)

// Default table names.
const (
	DefaultTable         = "keysched_inbox"
	DefaultVersionsTable = "keysched_versions"
)

// MaxIDLen bounds an event ID (and a Versions entity), in bytes. An outbox
// event's ID (at most outbox.MaxIDLen, 256 bytes) always fits: it is the
// natural ID to deduplicate on downstream. The room above it is for IDs made
// elsewhere (a topic, partition and offset, say).
const MaxIDLen = 1024

// Sentinel errors. Compare with errors.Is.
var (
	// ErrInvalidOption is wrapped by New's and NewVersions' errors for a
	// bad option or a nil db. The refusal of an option is a
	// *keysched.OptionError naming it, with this Sentinel (errors.As finds
	// it, as it does every keysched module's refused option; errors.Is
	// matches keysched.ErrInvalidOption too).
	ErrInvalidOption = errors.New("inbox: invalid option")
	// ErrInvalidID is returned for an empty event ID or entity, or one
	// longer than MaxIDLen bytes, or with a NUL byte or invalid UTF-8.
	ErrInvalidID = errors.New("inbox: invalid event ID or entity")
	// ErrNilFunc is returned by Apply for a nil effect function.
	ErrNilFunc = errors.New("inbox: nil effect function")
	// ErrTxEnded is wrapped by Apply's error (Inbox's and Versions') when
	// fn committed or rolled back the transaction itself, which it must
	// not do: Apply commits or rolls it back. The error says which
	// happened: after fn's commit the ID (or version) and fn's writes
	// before it are recorded, so a redelivery finds the event handled;
	// after fn's rollback nothing is.
	ErrTxEnded = errors.New("inbox: fn committed or rolled back the transaction itself (it must not: Apply does)")
	// ErrCommitUnknown is wrapped by Apply's error (Inbox's and Versions')
	// when the connection broke during the commit (the server restarted or
	// went away, the backend was terminated), or when ctx ended while the
	// commit was in flight (the error then wraps ctx's too): the commit may
	// or may not have taken effect, and the client cannot know from the
	// failed call.
	// The ID and fn's writes are committed together or not at all, so a
	// redelivery is safe either way: it applies fn once if they were not,
	// and finds the ID (already handled) if they were. The error also says
	// what Seen reported just after (a commit still being completed by the
	// server can land after that look), or, ctx having ended, that it could
	// not look.
	ErrCommitUnknown = errors.New("inbox: commit cut short (connection lost or ctx ended): outcome unknown")
	// ErrNilTx is returned by Record and Gate for a nil transaction.
	ErrNilTx = errors.New("inbox: nil transaction")
	// ErrNoSchema is wrapped by the error of Apply, Record, Seen, Cleanup
	// and Versions' Apply, Gate and Current when the table (or a column
	// of it) is missing: run CreateSchema (or Schema's SQL) first. On an
	// in-memory SQLite database each connection has its own tables.
	ErrNoSchema = errors.New("inbox: table missing: run CreateSchema")
	// ErrSchemaConflict (sqldb.ErrSchemaConflict) is wrapped by
	// CreateSchema's error (Inbox's and Versions') when a name its schema
	// creates is taken by another object: a table without the columns it
	// needs (an outbox's table, another Inbox's or Versions' table, the
	// application's), an index of another table. CREATE ... IF NOT EXISTS
	// would have skipped it, and the calls would have run on it. Nothing is
	// created.
	ErrSchemaConflict = sqldb.ErrSchemaConflict
	// ErrDBClosed (sqldb.ErrDBClosed) is wrapped by the error of a call
	// on an Inbox or Versions whose *sql.DB was closed (its Close called),
	// around database/sql's "sql: database is closed": no call can pass
	// again.
	ErrDBClosed = sqldb.ErrDBClosed
	// ErrNilContext is returned by every method given a nil context (it
	// is keysched.ErrNilContext).
	ErrNilContext = keysched.ErrNilContext
	// ErrZeroInbox is returned by the methods of a nil or zero Inbox (one
	// not made by New) that return an error; the others return zero values.
	ErrZeroInbox = errors.New("inbox: nil or zero Inbox (make one with New)")
	// ErrZeroVersions is returned by the methods of a nil or zero Versions
	// (one not made by NewVersions) that return an error; the others return
	// zero values.
	ErrZeroVersions = errors.New("inbox: nil or zero Versions (make one with NewVersions)")
)

// An Option configures New and NewVersions. A bad one makes them fail with a
// *keysched.OptionError naming it (errors.Is matches ErrInvalidOption and
// keysched.ErrInvalidOption). Options meet by keysched.Option's rule, the
// one rule of every keysched module (see its "How options meet"): the last
// of a name wins; WithRetention with NewVersions is refused (versions never
// expire).
type Option func(*options) error

// refused is the *keysched.OptionError of r (nil for nil), with
// ErrInvalidOption for Sentinel.
func refused(r *optcheck.Refusal) error { return opterror.New(ErrInvalidOption, r) }

type options struct {
	dialect   Dialect
	table     string
	retention time.Duration
}

// WithDialect says which database db is, for drivers that cannot be
// recognised (default Auto). A dialect that contradicts a driver New
// recognises makes New (and NewVersions) fail with ErrInvalidOption wrapping
// sqldb.ErrDialectMismatch.
func WithDialect(d Dialect) Option {
	return func(o *options) error {
		if r := optcheck.OneOf("WithDialect", d, "dialect", Auto, Postgres, SQLite); r != nil {
			return refused(r)
		}
		o.dialect = d
		return nil
	}
}

// WithTable names the table (default DefaultTable for an Inbox,
// DefaultVersionsTable for Versions): [a-z_][a-z0-9_]*, at most 48 bytes,
// not a reserved SQL word of PostgreSQL or SQLite (sqldb.Reserved:
// "select", "order", "user", "table"...; the statements name the table
// unquoted), and not ending in a suffix the inbox's or the outbox's schema
// derives names with (sqldb.DerivedSuffixes: "_processed_at", "_lease",
// "_dead", ...): an inbox "x_processed_at" would share its table with the
// index of an inbox "x", an inbox "x_lease" with the lease table of an
// outbox "x". A refused name is a *keysched.OptionError naming WithTable and
// saying why. An Inbox also creates the index name+"_processed_at";
// CreateSchema refuses a name that another object holds
// (ErrSchemaConflict).
func WithTable(name string) Option {
	return func(o *options) error {
		if sqldb.Reserved(name) {
			return refused(optcheck.Refuse("WithTable", strconv.Quote(name), "a reserved SQL word (PostgreSQL or SQLite): the schema's statements name the table unquoted"))
		}
		if !sqldb.ValidIdent(name) {
			return refused(optcheck.Refuse("WithTable", strconv.Quote(name), "want [a-z_][a-z0-9_]*, at most 48 bytes"))
		}
		if r := schemacheck.DerivedSuffix(name); r != nil {
			return refused(r)
		}
		o.table = name
		return nil
	}
}

// WithRetention makes Cleanup delete recorded IDs older than d (d > 0).
// Without it (the default) IDs are kept for ever and Cleanup deletes nothing.
//
// The risk: an event redelivered after its ID was deleted is applied again.
// The retention must be longer than the longest time after which an event can
// come back: the broker's retention if a consumer group can be reset to an
// old offset, the outbox's retention of sent rows if they can be replayed,
// how long dead events can wait before an operator resumes them, backups that
// can be restored. When no such bound exists, keep IDs for ever or use
// Versions, which needs no expiry.
func WithRetention(d time.Duration) Option {
	return func(o *options) error {
		if r := optcheck.Positive("WithRetention", d); r != nil {
			return refused(r)
		}
		o.retention = d
		return nil
	}
}

func build(db *sql.DB, def string, opts []Option) (options, error) {
	if db == nil {
		return options{}, fmt.Errorf("%w: nil *sql.DB", ErrInvalidOption)
	}
	o := options{table: def}
	for i, opt := range opts {
		if opt == nil {
			return o, refused(optcheck.NilOption(i, "Option"))
		}
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	d, err := sqldb.Resolve(db, o.dialect)
	if err != nil {
		return o, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	o.dialect = d
	return o, nil
}

func validID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty", ErrInvalidID)
	}
	// PostgreSQL's TEXT refuses NUL and invalid UTF-8 (a database error
	// on every redelivery); SQLite would store them: refused on both.
	if err := sqldb.CheckText("ID", id, MaxIDLen); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	return nil
}

// An Inbox records the IDs of handled events. Safe for concurrent use.
//
// The zero Inbox is not usable: use New. The methods of a nil or zero Inbox
// return ErrZeroInbox (those with an error result) or zero values, and
// touch no database.
type Inbox struct {
	db                     *sql.DB
	o                      options
	insert, cleanup, check string
	busy                   *inFlight // the IDs of the Applys running
}

// New returns an Inbox on db. It does not touch the database: create the
// table with CreateSchema (or Schema's SQL).
//
// SQLite: open db with sqldb.OpenSQLite, or give your own *sql.DB the same
// settings on every connection of its pool: WAL journal, a busy timeout and
// immediate transactions. With modernc.org/sqlite that is the DSN
// "app.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"
// (a PRAGMA run with db.Exec reaches one pooled connection only). A plain
// sql.Open("sqlite", path) has no busy timeout and deferred transactions:
// concurrent writers (the relay's marks and claims among them) then fail at
// once with SQLITE_BUSY ("database is locked") instead of waiting their turn.
func New(db *sql.DB, opts ...Option) (*Inbox, error) {
	o, err := build(db, DefaultTable, opts)
	if err != nil {
		return nil, err
	}
	in := &Inbox{db: db, o: o, busy: newInFlight()}
	r := func(s string) string { return sqldb.Rebind(o.dialect, s) }
	in.insert = r(`INSERT INTO ` + o.table + ` (id, processed_at) VALUES (?, ?) ON CONFLICT (id) DO NOTHING`)
	in.cleanup = r(`DELETE FROM ` + o.table + ` WHERE processed_at < ?`)
	in.check = r(`SELECT 1 FROM ` + o.table + ` WHERE id = ?`)
	return in, nil
}

// Schema returns the SQL that creates the inbox table (idempotent).
// processed_at is TIMESTAMPTZ on PostgreSQL, INTEGER microseconds since the
// Unix epoch on SQLite. It returns nil for a nil or zero Inbox.
func (in *Inbox) Schema() []string {
	if in.zero() {
		return nil
	}
	t := in.o.table
	if in.o.dialect == Postgres {
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + t + ` (id TEXT PRIMARY KEY, processed_at TIMESTAMPTZ NOT NULL)`,
			`CREATE INDEX IF NOT EXISTS ` + t + `_processed_at ON ` + t + ` (processed_at)`,
		}
	}
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + t + ` (id TEXT PRIMARY KEY, processed_at INTEGER NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS ` + t + `_processed_at ON ` + t + ` (processed_at)`,
	}
}

// CreateSchema runs Schema's statements in one transaction. Run it once at
// start-up or from a migration. It is idempotent, and concurrent calls
// (instances of a service starting at once) take turns: on PostgreSQL the
// transaction first takes a transaction-level advisory lock on the table's
// name, as the outbox's does (without it the later of two concurrent calls
// on an empty database failed with a unique violation of the catalog).
func (in *Inbox) CreateSchema(ctx context.Context) error {
	if in.zero() {
		return ErrZeroInbox
	}
	if ctx == nil {
		return ErrNilContext
	}
	t := in.o.table
	return createSchema(ctx, in.db, in.o.dialect, "the inbox table "+t, []schemacheck.Object{
		{Name: t, Kind: schemacheck.Table, Columns: []string{"id", "processed_at"}},
		{Name: t + "_processed_at", Kind: schemacheck.Index, On: t},
	}, in.Schema())
}

// createSchema runs stmts in one transaction, after taking the schema lock
// on objs[0], the table (schemacheck.Lock), and checking that the
// names of objs are free or already those objects (schemacheck).
func createSchema(ctx context.Context, db *sql.DB, d Dialect, what string, objs []schemacheck.Object, stmts []string) error {
	tx, err := schemacheck.Begin(ctx, db, d)
	if err != nil {
		return fmt.Errorf("inbox: create schema: %w", sqldb.WrapDBClosed(err))
	}
	defer tx.Rollback()
	if err := schemacheck.Lock(ctx, tx, d, objs[0].Name); err != nil {
		return fmt.Errorf("inbox: create schema: %w", sqldb.WrapDBClosed(err))
	}
	if err := schemacheck.Check(ctx, tx, d, what, objs); err != nil {
		return fmt.Errorf("inbox: create schema: %w", err)
	}
	for _, s := range stmts {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("inbox: create schema: %w\n%s", err, s)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("inbox: create schema: %w", err)
	}
	return nil
}

// zero reports a nil Inbox or one not made by New.
func (in *Inbox) zero() bool { return in == nil || in.db == nil }

func timeArg(d Dialect, t time.Time) any {
	if d == Postgres {
		return t
	}
	return t.UnixMicro()
}

// Apply handles one delivery of the event eventID: in one transaction, it
// records the ID and runs fn, the event's effect, with that transaction; it
// commits when fn returns nil.
//
// Results:
//   - (true, nil): the ID was new; fn ran and its writes committed with the
//     ID.
//   - (false, nil): the ID was already recorded ("already handled"): fn did
//     not run and nothing was written. Acknowledge the delivery.
//   - (false, err): nothing was recorded, so a redelivery runs fn again:
//     fn's error (returned as is, unwrapped), a database error, or ctx's.
//     Two exceptions: an error wrapping ErrTxEnded: fn committed or
//     rolled back tx itself (a bug in fn); if it committed, the ID and
//     fn's writes before the commit are recorded (Seen reports true), and
//     the error says so. And an error wrapping ErrCommitUnknown: the
//     connection broke during the commit, which may have taken effect;
//     the ID is recorded if and only if fn's writes are, so a redelivery
//     is still safe (applied once, or "already handled"). ctx ending
//     during the commit is the same case (ErrCommitUnknown, wrapping
//     ctx's error): the server may complete the commit. An fn that ends
//     tx itself while ctx also ends cannot be told from database/sql's
//     rollback at ctx's end: Apply then returns ctx's error (or fn's),
//     without ErrTxEnded, and the ID is recorded if fn committed (Seen
//     says); a redelivery is still safe.
//
// Concurrent deliveries of one ID run fn at most once in total: the second
// one's insert waits for the first transaction (PostgreSQL's unique index,
// SQLite's single writer) and then finds the ID, or, if the first rolled
// back, records it and runs fn itself. A uniqueness violation is never
// returned as an error, nor, on PostgreSQL under REPEATABLE READ or
// SERIALIZABLE (default_transaction_isolation), the serialization failure
// of the insert that waited: Apply then begins a new transaction (fn has not
// run), up to 100 in all, and finds the ID. A serialization failure of fn's
// statements or of the commit is returned (nothing recorded). fn must do its
// work through tx (writes made any other way are not undone with it) and must
// not commit or roll it back. A panic in fn rolls the transaction back and is
// re-raised.
//
// fn must not call Apply for the same event ID (a nested Apply): its
// transaction waits for this one's row (PostgreSQL) or for the write lock
// (SQLite, where any Apply inside fn waits so, as may one that needs a
// second pooled connection), and this one waits for fn. The nested Apply
// ends only when ctx does (on SQLite, or after the busy timeout, with
// SQLITE_BUSY), its error then saying that an Apply of the ID was in
// flight in this process when it began (the outer Apply returns that error
// as fn's, nothing recorded). Inside fn, Record with fn's tx tells whether
// an ID is recorded.
func (in *Inbox) Apply(ctx context.Context, eventID string, fn func(tx *sql.Tx) error) (applied bool, err error) {
	if in.zero() {
		return false, ErrZeroInbox
	}
	if ctx == nil {
		return false, ErrNilContext
	}
	if fn == nil {
		return false, ErrNilFunc
	}
	if err := validID(eventID); err != nil {
		return false, err
	}
	others, leave := in.busy.enter(eventID)
	defer leave()
	defer func() { err = selfWait(ctx, in.o.dialect, err, others, "event ID", eventID) }()
	return runTx(ctx, in.db, func(tx *sql.Tx) (bool, error) {
		first, err := in.Record(ctx, tx, eventID)
		if err != nil || !first {
			return false, gateConflict(in.o.dialect, err)
		}
		return true, fn(tx)
	}, func(ctx context.Context) string {
		if seen, err := in.Seen(ctx, eventID); err != nil {
			return fmt.Sprintf("whether the ID %q is recorded is unknown: %v", eventID, err)
		} else if seen {
			return fmt.Sprintf("the ID %q is recorded: fn committed", eventID)
		}
		return fmt.Sprintf("the ID %q is not recorded", eventID)
	})
}

// inFlight counts the Applys running per event ID (or entity) in this
// process, to name the likely cause of an Apply that waited until ctx
// ended while another of the same ID ran: that it runs inside the other's
// fn, and waits for its own transaction (selfWait).
type inFlight struct {
	mu sync.Mutex
	n  map[string]int
}

func newInFlight() *inFlight { return &inFlight{n: map[string]int{}} }

// enter counts an Apply of id in and returns how many others of id were
// running, and the function that counts it out.
func (f *inFlight) enter(id string) (others int, leave func()) {
	f.mu.Lock()
	others = f.n[id]
	f.n[id]++
	f.mu.Unlock()
	return others, func() {
		f.mu.Lock()
		if f.n[id]--; f.n[id] == 0 {
			delete(f.n, id)
		}
		f.mu.Unlock()
	}
}

// selfWait adds to err, the error of an Apply of id that waited until ctx
// ended (or, on SQLite, for the busy timeout: SQLITE_BUSY) while others
// Applys of id were running in this process when it began, the likely
// cause: it runs inside one of their fns (a nested Apply), and waited for
// that Apply's transaction, which waits for it. (A concurrent delivery of
// id waits the same way, for as long as the other's fn runs: hence "if".)
func selfWait(ctx context.Context, d Dialect, err error, others int, what, id string) error {
	if err == nil || others == 0 {
		return err
	}
	waited := "until ctx ended"
	switch {
	case ctx.Err() != nil:
	case d == SQLite && sqldb.Classify(err) == sqldb.KindConflict:
		waited = "for the busy timeout"
	default:
		return err
	}
	return fmt.Errorf("%w (an Apply of the %s %q was in flight in this process when this one began: if this Apply runs inside that one's fn, it waited for its own transaction %s; inside fn, use Record (or Gate) with fn's tx)", err, what, id, waited)
}

// maxGateAttempts bounds the transactions Apply begins for one call when the
// ID's insert (or the version's gate) fails with a serialization failure.
const maxGateAttempts = 100

// conflictErr marks an error of the gate step (Record or Gate, before fn
// ran) that a new transaction resolves: a serialization failure or deadlock
// on PostgreSQL (REPEATABLE READ or SERIALIZABLE, where a row committed
// since the transaction's snapshot cannot be read through ON CONFLICT).
type conflictErr struct{ err error }

func (c *conflictErr) Error() string { return c.err.Error() }
func (c *conflictErr) Unwrap() error { return c.err }

// gateConflict returns err marked as a conflictErr when it is one.
func gateConflict(d Dialect, err error) error {
	if err != nil && d == Postgres && sqldb.Classify(err) == sqldb.KindConflict {
		return &conflictErr{err}
	}
	return err
}

// runTx runs body in a transaction and commits when body returns (true, nil).
// If body's fn ended the transaction itself (the commit or rollback finds it
// done while ctx is live), the error wraps ErrTxEnded and what state says
// (whether the transaction's writes are recorded). When body fails with a
// conflictErr (fn has not run), it begins a new transaction, up to
// maxGateAttempts in all: the conflict came from a transaction that has
// since committed, whose row the new snapshot sees.
func runTx(ctx context.Context, db *sql.DB, body func(tx *sql.Tx) (bool, error), state func(ctx context.Context) string) (done bool, err error) {
	for attempt := 1; ; attempt++ {
		done, err = runTxOnce(ctx, db, body, state)
		var c *conflictErr
		if !errors.As(err, &c) {
			return done, err
		}
		if attempt == maxGateAttempts || ctx.Err() != nil {
			return false, c.err
		}
	}
}

func runTxOnce(ctx context.Context, db *sql.DB, body func(tx *sql.Tx) (bool, error), state func(ctx context.Context) string) (done bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("inbox: begin: %w", sqldb.WrapDBClosed(err))
	}
	ended := func(e error) bool { return errors.Is(e, sql.ErrTxDone) && ctx.Err() == nil }
	finished := false
	defer func() {
		if !finished {
			tx.Rollback() // fn panicked: the panic goes on
		}
	}()
	ok, err := body(tx)
	if err != nil || !ok {
		finished = true
		if rb := tx.Rollback(); ended(rb) && ok {
			return false, fmt.Errorf("%w (%s): %w", ErrTxEnded, state(ctx), err)
		}
		return false, err
	}
	finished = true
	live := ctx.Err() == nil
	if err := tx.Commit(); err != nil {
		if ended(err) {
			return false, fmt.Errorf("%w (%s)", ErrTxEnded, state(ctx))
		}
		if errors.Is(err, sql.ErrTxDone) && ctx.Err() != nil {
			// database/sql rolled the transaction back when ctx ended.
			return false, fmt.Errorf("inbox: commit: %w: %w", err, ctx.Err())
		}
		if sqldb.Classify(err) == sqldb.KindConnection || live && ctx.Err() != nil {
			// The COMMIT may have reached the server, which goes on
			// with it whatever the client does: ctx ending while it
			// is in flight leaves the outcome as unknown as a lost
			// connection does. (With ctx ended, the look at the ID
			// fails at once and says so: Apply returns promptly.)
			return false, fmt.Errorf("%w (%s): %w", ErrCommitUnknown, state(ctx), err)
		}
		return false, fmt.Errorf("inbox: commit: %w", err)
	}
	return true, nil
}

// Record records eventID inside tx, the caller's transaction, and reports
// whether it was new. When it returns false, the event was handled already:
// roll tx back (or go on without the effect). Use it when you manage the
// transaction yourself; Apply is Record plus the transaction. On PostgreSQL
// under REPEATABLE READ or SERIALIZABLE, Record fails with a serialization
// failure (SQLSTATE 40001) when a concurrent transaction recorded the ID
// since tx's snapshot: roll tx back and begin again (Apply does). On a
// SQLite connection without a busy timeout (a plain sql.Open("sqlite",
// path)), its SQLITE_BUSY error says to open the database with
// sqldb.OpenSQLite; its SQLITE_BUSY_SNAPSHOT (tx read before another
// connection wrote, in WAL mode; no busy timeout helps) says to begin tx
// again, IMMEDIATE.
func (in *Inbox) Record(ctx context.Context, tx *sql.Tx, eventID string) (first bool, err error) {
	if in.zero() {
		return false, ErrZeroInbox
	}
	if ctx == nil {
		return false, ErrNilContext
	}
	if tx == nil {
		return false, ErrNilTx
	}
	if err := validID(eventID); err != nil {
		return false, err
	}
	res, err := tx.ExecContext(ctx, in.insert, eventID, timeArg(in.o.dialect, sqldb.Now()))
	if err != nil {
		return false, noSchema(in.o.table, fmt.Errorf("inbox: record %q: %w", eventID, sqldb.WithBusyTimeoutAdvice(ctx, tx, err)))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("inbox: record %q: %w", eventID, err)
	}
	return n == 1, nil
}

// Seen reports whether eventID is recorded (committed). An ID no event can
// have (see ErrInvalidID) is ErrInvalidID, as Apply's.
func (in *Inbox) Seen(ctx context.Context, eventID string) (bool, error) {
	if in.zero() {
		return false, ErrZeroInbox
	}
	if ctx == nil {
		return false, ErrNilContext
	}
	if err := validID(eventID); err != nil {
		return false, err
	}
	var one int
	err := in.db.QueryRowContext(ctx, in.check, eventID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, noSchema(in.o.table, fmt.Errorf("inbox: seen %q: %w", eventID, err))
	}
	return true, nil
}

// Cleanup deletes the IDs recorded longer ago than the retention
// (WithRetention) and returns how many it deleted; without a retention it
// deletes nothing. Call it periodically. See WithRetention for the risk.
func (in *Inbox) Cleanup(ctx context.Context) (int64, error) {
	if in.zero() {
		return 0, ErrZeroInbox
	}
	if ctx == nil {
		return 0, ErrNilContext
	}
	if in.o.retention <= 0 {
		return 0, nil
	}
	res, err := in.db.ExecContext(ctx, in.cleanup, timeArg(in.o.dialect, sqldb.Now().Add(-in.o.retention)))
	if err != nil {
		return 0, noSchema(in.o.table, fmt.Errorf("inbox: cleanup: %w", err))
	}
	return res.RowsAffected()
}

// noSchema wraps err, an error of a statement on table, with ErrNoSchema
// when the database says the table or a column of it is missing, and with
// ErrDBClosed when the *sql.DB was closed.
func noSchema(table string, err error) error {
	if sqldb.Classify(err) != sqldb.KindSchema {
		return sqldb.WrapDBClosed(err)
	}
	return fmt.Errorf("%w (table %s): %w", ErrNoSchema, table, err)
}
