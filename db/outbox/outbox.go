package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/schemacheck"
	"github.com/keysched/keysched/db/sqldb"
	"github.com/keysched/keysched/internal/optcheck"
)

// Dialect names the database an Outbox writes to. See the constants.
type Dialect = sqldb.Dialect

// The dialects. Auto (the default) finds out from the *sql.DB's driver:
// pgx's stdlib driver is Postgres, modernc.org/sqlite is SQLite.
const (
	Auto     = sqldb.Auto
	Postgres = sqldb.Postgres
	SQLite   = sqldb.SQLite
)

// DefaultTable is the outbox table's name when WithTable is not given. The
// relay's lease table is named after it with the suffix "_lease".
const DefaultTable = "keysched_outbox"

// Sentinel errors. Compare with errors.Is.
var (
	// ErrInvalidOption is wrapped by every error New and NewRelay return
	// for a bad option. The refusal of an option of this package is a
	// *keysched.OptionError naming it, with this Sentinel (errors.As
	// finds it, as it does every keysched module's refused option;
	// errors.Is matches keysched.ErrInvalidOption too).
	ErrInvalidOption = errors.New("outbox: invalid option")
	// ErrInvalidEvent is wrapped by Write's error for an event it refuses,
	// the error naming the field: an empty key; an ID, key or type longer
	// than MaxIDLen, MaxKeyLen or MaxTypeLen bytes; a NUL byte or invalid
	// UTF-8 in the ID, key or type; invalid UTF-8 in a header's name or
	// value. It is returned before any SQL: nothing was written and tx is
	// untouched (still usable, also on PostgreSQL).
	ErrInvalidEvent = errors.New("outbox: invalid event")
	// ErrInvalidKey is wrapped by the error of Resume, Skip, SkipHead and
	// SkipEvent (of an Outbox or a Relay) for a key no event can have: empty, longer
	// than MaxKeyLen bytes, or with a NUL byte or invalid UTF-8.
	ErrInvalidKey = errors.New("outbox: invalid key")
	// ErrNilContext is returned by every method given a nil context (it is
	// keysched.ErrNilContext, as inbox.ErrNilContext).
	ErrNilContext = keysched.ErrNilContext
	// ErrDuplicateID is wrapped by Write's error when the outbox already
	// holds a row with the event's ID. On PostgreSQL the caller's
	// transaction is aborted by the failed insert and must be rolled back.
	ErrDuplicateID = errors.New("outbox: duplicate event ID")
	// ErrNilTx is returned by Write for a nil transaction.
	ErrNilTx = errors.New("outbox: nil transaction")
	// ErrNotParked is returned by Resume, Skip, SkipHead and SkipEvent for
	// a key with no dead row.
	ErrNotParked = errors.New("outbox: key has no dead row")
	// ErrHeadChanged is matched (errors.Is) by SkipEvent's error when the
	// key's oldest dead row (its head) is another event than the one
	// given: the head seen was resumed, skipped or recovered meanwhile (and
	// a later row may have died since). Nothing moved. The error is a
	// *HeadChangedError (errors.As) naming the key, the ID given and the
	// current head's ID.
	ErrHeadChanged = errors.New("outbox: the key's dead head is another event")
	// ErrOutcomeUnknown is wrapped by the error of Resume, Skip, SkipHead,
	// SkipEvent and Recover when the connection broke, or ctx ended, while a
	// statement that moves rows (Recover: a batch's COMMIT) was in flight:
	// the server may have made the move, and the client cannot tell from
	// the failed call. Look (Dead, Parked, Recoverable) before trying
	// again: a Skip tried again after one that took effect gives up the
	// key's next dead row too (a SkipEvent tried again does not: it
	// answers ErrHeadChanged or ErrNotParked).
	ErrOutcomeUnknown = errors.New("outbox: outcome unknown: the database may have made the move")
	// ErrClosed is returned by Run after Close, and by the Relay's Resume,
	// Skip, SkipHead and Recover after Close (use the Outbox's, which need
	// no relay). A second Run (a Relay runs once) returns an error that
	// matches it (errors.Is) and says that Run is running or has returned.
	ErrClosed = errors.New("outbox: relay closed")
	// ErrNilSink is returned by NewRelay for a nil sink.
	ErrNilSink = errors.New("outbox: nil sink")
	// ErrSchemaOutdated is wrapped by Run's error when the lease table
	// lacks the token or the epoch column (created by an older version of
	// this package): run CreateSchema (or see Schema) first.
	ErrSchemaOutdated = errors.New("outbox: lease table has no token or epoch column: run CreateSchema")
	// ErrNoSchema is wrapped by Run's error when the outbox table or its
	// lease table does not exist, and by Write's when its INSERT finds a
	// table or column missing (and by Lookup's, and the operator's calls':
	// Resume, Skip, SkipHead, SkipEvent, Dead, Parked, Count, Recover and
	// Recoverable): run CreateSchema (or see Schema) first.
	// Run checks before it claims anything and returns at once. The
	// table is missing on the connection that looked: on an in-memory
	// SQLite database (which sqldb.OpenSQLite refuses) every connection of
	// the pool has its own database, so CreateSchema may have run on
	// another one.
	ErrNoSchema = errors.New("outbox: table missing on this connection: run CreateSchema (an in-memory SQLite database is per connection)")
	// ErrDatabaseUnavailable is wrapped by Run's error when every poll
	// failed for longer than WithMaxOutage; the error also says how many
	// calls failed and wraps the last one's error.
	ErrDatabaseUnavailable = errors.New("outbox: database unavailable")
	// ErrSchemaConflict (sqldb.ErrSchemaConflict) is wrapped by
	// CreateSchema's error when a name its schema creates (Schema) is
	// taken by another object: a table without the columns the outbox
	// needs (another outbox's lease table, an inbox's table, the
	// application's), an index or trigger of another table, an object of
	// another kind. CREATE ... IF NOT EXISTS would have skipped it, and
	// the outbox would have run on it. Nothing is created.
	ErrSchemaConflict = sqldb.ErrSchemaConflict
	// ErrDBClosed (sqldb.ErrDBClosed) is wrapped by the error of a call
	// on an Outbox whose *sql.DB was closed (its Close called), around
	// database/sql's "sql: database is closed": no call can pass again.
	// A relay's Run returns it at once rather than wait it out as an
	// outage.
	ErrDBClosed = sqldb.ErrDBClosed
	// ErrZeroOutbox is returned by the methods of a nil or zero Outbox (one
	// not made by New) that return an error; the others return zero values.
	ErrZeroOutbox = errors.New("outbox: nil or zero Outbox (make one with New)")
	// ErrZeroRelay is returned by the methods of a nil or zero Relay (one
	// not made by Outbox.NewRelay) that return an error; the others return
	// zero values.
	ErrZeroRelay = errors.New("outbox: nil or zero Relay (make one with Outbox.NewRelay)")
)

// MaxIDLen, MaxKeyLen and MaxTypeLen bound an event's ID, key and type, in
// bytes (Write refuses longer ones with ErrInvalidEvent). An outbox event's
// ID is the natural inbox ID downstream: MaxIDLen is within inbox.MaxIDLen
// (1024), so every outbox ID is a valid inbox ID; the inbox allows longer
// IDs for other sources (a topic, partition and offset, say).
const (
	MaxIDLen   = 256
	MaxKeyLen  = 1024
	MaxTypeLen = 256
)

// An Event is one outbox row: what a relay hands to its Sink.
type Event struct {
	// ID is the producer-assigned event ID, unique in the outbox: at most
	// MaxIDLen bytes of valid UTF-8 without NUL. Write fills an empty one
	// with a UUIDv7 (time-ordered, RFC 9562, 36 bytes). Consumers
	// deduplicate on it (see package inbox).
	ID string
	// Key is the event's ordering key: the relay publishes a key's events
	// one at a time, in the order they were written, and different keys
	// in parallel. Non-empty, at most MaxKeyLen bytes of valid UTF-8
	// without NUL.
	Key string
	// Type names the kind of event (free form, may be empty; at most
	// MaxTypeLen bytes of valid UTF-8 without NUL).
	Type string
	// Payload is the event's body, stored as bytes (BYTEA, BLOB).
	Payload []byte
	// Headers is metadata (a correlation ID, a trace parent...), stored as
	// a JSON object, so names and values are text: Write refuses invalid
	// UTF-8 in either (ErrInvalidEvent naming the header) rather than
	// store it altered; any other string, NUL bytes included, reads back
	// unchanged. Put binary metadata in the payload, or encode it (base64).
	// nil and an empty map both read back as nil.
	Headers map[string]string
	// CreatedAt is when the event was written; Write sets a zero one to the
	// current time. Stored with microsecond precision, read back in UTC.
	CreatedAt time.Time
	// Seq is the row's position in the outbox, assigned by the database on
	// insert (Write ignores it): increasing in insert order, never reused.
	// A key's events are published in Seq order.
	Seq int64
}

// An Outbox writes events into an outbox table, in the caller's
// transactions, and makes the relays that publish them. It holds no
// connection of its own: every call uses the *sql.DB it was made with, or
// the transaction given. Safe for concurrent use.
//
// The zero Outbox is not usable: use New. The methods of a nil or zero
// Outbox return ErrZeroOutbox (those with an error result) or zero values,
// and touch no database.
type Outbox struct {
	db      *sql.DB
	dialect Dialect
	table   string
	notify  bool
	// notifyWrite: Write's INSERT queues the notification itself (no
	// trigger); see WithNotifyFromWrite.
	notifyWrite bool
	q           queries

	beforeRecoverCommit func() // tests: each Recover batch's, before its COMMIT

	busyWarned atomic.Bool // CreateSchema warned of a SQLite database without a busy timeout
}

// An Option configures New. A bad one makes New fail with a
// *keysched.OptionError naming it (errors.Is matches ErrInvalidOption and
// keysched.ErrInvalidOption). Options meet by keysched.Option's rule, the
// one rule of every keysched module (see its "How options meet"): the last
// of a name wins.
type Option func(*Outbox) error

// WithDialect says which database db is (Postgres or SQLite), for drivers
// New cannot recognise. Default Auto: found from the driver. A dialect that
// contradicts a driver New recognises makes New fail (sqldb.ErrDialectMismatch).
func WithDialect(d Dialect) Option {
	return func(o *Outbox) error {
		if r := optcheck.OneOf("WithDialect", d, "dialect", Auto, Postgres, SQLite); r != nil {
			return refused(r)
		}
		o.dialect = d
		return nil
	}
}

// WithTable names the outbox table (default DefaultTable): lower-case
// letters, digits and underscores, starting with a letter or underscore, at
// most 48 bytes, not a reserved SQL word of PostgreSQL or SQLite
// (sqldb.Reserved: "select", "order", "user", "table"...; the statements
// name the table unquoted), and not ending in a suffix the outbox's or the
// inbox's schema derives names with (sqldb.DerivedSuffixes: "_lease",
// "_lease_epoch", "_lease_owner", "_idle", "_pending_key", "_dead",
// "_sent", "_processed_at"): an outbox "x_lease" would share its table
// with the lease table of an outbox "x" in the same database. A refused
// name is a *keysched.OptionError naming WithTable and saying why. The
// outbox's other objects are named after it: name+"_lease" (the lease
// table, with the index name+"_lease_owner"), the indexes
// name+"_pending_key", name+"_dead" and name+"_sent", and on PostgreSQL
// name+"_idle" (idle relays), name+"_lease_epoch" (the claims' epoch
// sequence) and the NOTIFY trigger and function name+"_notify"; on SQLite
// name+"_lease_epoch" is a table, with two triggers on the lease table
// (name+"_lease_epoch_insert", name+"_lease_epoch_update"). Schema lists
// them all; to remove an outbox, drop them. CreateSchema refuses a name
// among them that another object holds (ErrSchemaConflict).
func WithTable(name string) Option {
	return func(o *Outbox) error {
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

// WithNotify says whether the PostgreSQL schema that CreateSchema makes (and
// Schema returns) has the trigger that NOTIFYs relays of committed writes
// (default true; no effect on SQLite, which has none).
//
// On (the default), a committed write wakes an idle relay at once (its
// LISTEN, see WithListen). A notification has a price, paid by writers:
// PostgreSQL serialises the commits of every transaction that sent one,
// server-wide (a heavyweight lock taken before the commit record is written
// and held until after it is flushed), so concurrent writers no longer share
// WAL flushes (group commit); with 4 writers, notifying every write cost a
// third to a half of the outbox's write rate. So the trigger notifies only
// while a relay is idle: a relay whose poll had room and found no row to
// fetch writes a row in the table <table>_idle (unlogged: a relay's token
// and an expiry, a lease from then), polls once more, and sleeps until a
// notification or its next poll; it deletes the row when a fetch finds rows,
// before publishing them. A busy relay is not notified: it polls again
// once the rows it fetched have settled (at once after a full batch,
// otherwise 10 ms after its last poll began at the soonest, and 25 ms
// after a poll that found rows in any case, or WithPollInterval if
// shorter; a poll finding nothing then makes it idle). A write whose insert ran before a relay went
// idle and that commits after the relay's last look notifies nobody: the
// relay's next poll finds it, WithPollInterval later at most; "ran before"
// means the transaction's first inserting statement: each transaction reads
// <table>_idle once, there (the writers' role needs SELECT on it; a
// transaction-local setting, keysched_notify.<table>, remembers the check
// until the transaction ends). See db/README.md, "NOTIFY and the write
// rate".
//
// Off, CreateSchema drops the trigger and its function if they are there
// (both ways are idempotent: switching is one CreateSchema), writes send no
// notification, and relays made by NewRelay on this Outbox do not LISTEN
// (they hold no connection for it): an idle relay finds a committed write
// at its next poll, WithPollInterval (default DefaultPollInterval) later at
// most. The trigger is the table's, not the process's: give every process
// that runs CreateSchema on the table the same setting, or the last one to
// run it decides.
func WithNotify(on bool) Option {
	return func(o *Outbox) error {
		o.notify = on
		return nil
	}
}

// WithNotifyFromWrite makes Write send the notification itself, instead of
// the schema's trigger (PostgreSQL; no effect on SQLite). CreateSchema then
// drops the NOTIFY trigger and its function (as WithNotify(false) does; both
// ways are idempotent, switching is one CreateSchema), and Write's INSERT is
// one statement that also queues a NOTIFY, delivered on commit, while a relay
// is idle:
//
//	WITH ins AS (INSERT INTO <table> ...) SELECT pg_notify('<table>', '')
//	FROM <table>_idle WHERE until > now() LIMIT 1
//
// PostgreSQL runs the INSERT to completion whether or not the SELECT returns
// a row. No extra round trip; relays LISTEN and go idle as with the trigger
// (see WithNotify), and an idle relay is woken at once by a committed Write.
//
// What it saves: the trigger's PL/pgSQL call at the end of every inserting
// statement; the idle table is read by the INSERT's own plan instead (a
// one-page table). See db/README.md, "NOTIFY and the write rate", for what
// it was measured to change.
//
// The trade-off: only Write notifies. Rows inserted into the table by other
// SQL (a migration, an INSERT ... SELECT, a writer in another language)
// wake nobody: an idle relay finds them at its next poll, WithPollInterval
// (default DefaultPollInterval) later at most. Every Write checks the idle
// table (the trigger checks once per transaction, at its first inserting
// statement), so a Write racing a relay's going idle notifies it unless the
// Write's own INSERT ran before the relay's idle row was committed; such a
// write is found by the relay's next poll, as with the trigger.
//
// Write then reads <table>_idle, which CreateSchema (and Schema) create: on a
// schema made before that table, Write fails with an error wrapping
// ErrNoSchema (and the database's)
// (the relation does not exist) until CreateSchema has run.
//
// The trigger is the table's: give every process that runs CreateSchema on
// the table, and every process that writes to it, the same setting (an
// Outbox without this option writing to a table whose trigger another
// process dropped notifies nobody: idle relays then find its rows by
// polling). Given with WithNotify(false), whatever the order, it is refused
// with a *keysched.OptionError naming both: no notification and
// notifications from Write cannot both hold.
func WithNotifyFromWrite() Option {
	return func(o *Outbox) error {
		o.notifyWrite = true
		return nil
	}
}

// New returns an Outbox on db. It does not touch the database: create the
// tables once with CreateSchema (or with the SQL that Schema returns, in your
// own migrations). A nil db or a bad option is an error wrapping
// ErrInvalidOption.
//
// SQLite: open db with sqldb.OpenSQLite, or give your own *sql.DB the same
// settings on every connection of its pool: WAL journal, a busy timeout and
// immediate transactions. With modernc.org/sqlite that is the DSN
// "app.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"
// (a PRAGMA run with db.Exec reaches one pooled connection only). A plain
// sql.Open("sqlite", path) has no busy timeout and deferred transactions:
// concurrent writers (the relay's marks and claims among them) then fail at
// once with SQLITE_BUSY ("database is locked") instead of waiting their turn.
func New(db *sql.DB, opts ...Option) (*Outbox, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *sql.DB", ErrInvalidOption)
	}
	o := &Outbox{db: db, table: DefaultTable, notify: true}
	for i, opt := range opts {
		if opt == nil {
			return nil, refused(optcheck.NilOption(i, "Option"))
		}
		if err := opt(o); err != nil {
			return nil, err
		}
	}
	if o.notifyWrite && !o.notify {
		return nil, refused(optcheck.Conflict("WithNotifyFromWrite", "WithNotify",
			"given with WithNotify(false): no notification and notifications from Write cannot both hold"))
	}
	d, err := sqldb.Resolve(db, o.dialect)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	o.dialect = d
	o.q = newQueries(d, o.table)
	if o.notifyWrite && d == Postgres {
		o.q.insert = o.q.insertNotify
	}
	return o, nil
}

// DB returns the database the Outbox was made with.
func (o *Outbox) DB() *sql.DB {
	if o.zero() {
		return nil
	}
	return o.db
}

// Dialect returns the Outbox's database dialect (never Auto, except for a
// nil or zero Outbox).
func (o *Outbox) Dialect() Dialect {
	if o.zero() {
		return Auto
	}
	return o.dialect
}

// Table returns the outbox table's name ("" for a nil or zero Outbox).
func (o *Outbox) Table() string {
	if o.zero() {
		return ""
	}
	return o.table
}

// zero reports a nil Outbox or one not made by New.
func (o *Outbox) zero() bool { return o == nil || o.db == nil }

// Schema returns the SQL statements that create the outbox's tables, indexes
// and (on PostgreSQL) the trigger that notifies idle relays of new rows, with
// the table of idle relays it reads (<table>_idle, see WithNotify), in order
// (with WithNotify(false) or WithNotifyFromWrite: statements that drop that
// trigger and its function instead). Each is idempotent (IF NOT EXISTS, OR
// REPLACE, IF EXISTS). Use it to put the schema into your own migrations. It
// returns nil for a nil or zero Outbox.
//
// Upgrading: PostgreSQL's schema gained <table>_idle, and the trigger's
// function now reads it (created before the function, so running Schema's
// statements in order is enough). Relays of an older version never write
// it: on the new trigger they are notified only while a relay of this
// version is idle, and otherwise poll (WithPollInterval).
//
// Upgrading: the lease table gained a token column (each relay's fencing
// token, see WithOwner), then an epoch column (each claim's epoch, see
// ClaimFrom) with its counter, <table>_lease_epoch (a sequence on
// PostgreSQL, a one-row table and two triggers on SQLite). On PostgreSQL
// Schema includes ALTER TABLE ... ADD COLUMN IF NOT EXISTS for both. SQLite
// has no such clause: CreateSchema adds each column the table lacks; with
// your own migrations, run Schema's statements (they create the counter)
// and then,
// once, ALTER TABLE <table>_lease ADD COLUMN token TEXT (if missing) and
// ALTER TABLE <table>_lease ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0. A
// relay refuses to run (Run returns an error wrapping ErrSchemaOutdated) on
// a lease table without either column.
func (o *Outbox) Schema() []string {
	if o.zero() {
		return nil
	}
	// Under WithNotifyFromWrite, Write notifies: no trigger.
	return schema(o.dialect, o.table, o.notify && !o.notifyWrite)
}

// CreateSchema runs Schema's statements in one transaction. It is
// idempotent, and concurrent calls (instances of a service starting at once)
// take turns: on PostgreSQL the transaction first takes a transaction-level
// advisory lock on the table's name (pg_advisory_xact_lock), without which
// concurrent runs deadlocked on the tables' locks (40P01) even on an
// existing schema; SQLite's write transactions are serialised anyway (with
// the immediate transactions OpenSQLite sets up). On PostgreSQL the
// transaction is READ COMMITTED whatever default_transaction_isolation says,
// so that the conflict check (ErrSchemaConflict), made after the lock, sees
// what a concurrent CreateSchema (of this outbox, or of an inbox of the
// same name) committed meanwhile.
//
// On a SQLite database in a file whose connections have no busy timeout
// (PRAGMA busy_timeout is 0: a plain sql.Open("sqlite", path) rather than
// sqldb.OpenSQLite), CreateSchema logs a warning naming sqldb.OpenSQLite on
// slog.Default(), once per Outbox, and succeeds: concurrent writers on
// such a database fail with SQLITE_BUSY instead of waiting their turn.
func (o *Outbox) CreateSchema(ctx context.Context) (err error) {
	defer func() { err = sqldb.WrapDBClosed(err) }()
	if o.zero() {
		return ErrZeroOutbox
	}
	if ctx == nil {
		return keysched.ErrNilContext
	}
	tx, err := schemacheck.Begin(ctx, o.db, o.dialect)
	if err != nil {
		return fmt.Errorf("outbox: create schema: %w", err)
	}
	defer tx.Rollback()
	if err := schemacheck.Lock(ctx, tx, o.dialect, o.table); err != nil {
		return fmt.Errorf("outbox: create schema: %w", err)
	}
	if err := schemacheck.Check(ctx, tx, o.dialect, "the outbox table "+o.table, schemaObjects(o.dialect, o.table)); err != nil {
		return fmt.Errorf("outbox: create schema: %w", err)
	}
	for _, stmt := range o.Schema() {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("outbox: create schema: %w\n%s", err, stmt)
		}
	}
	if o.dialect == SQLite {
		// A lease table created before the token or epoch column: SQLite
		// has no ADD COLUMN IF NOT EXISTS (PostgreSQL's Schema has it).
		for _, c := range sqliteAddColumns(o.table) {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ? COLLATE NOCASE`, o.table+"_lease", c[0]).Scan(&n); err != nil {
				return fmt.Errorf("outbox: create schema: %w", err)
			}
			if n == 0 {
				if _, err := tx.ExecContext(ctx, c[1]); err != nil {
					return fmt.Errorf("outbox: create schema: %w\n%s", err, c[1])
				}
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox: create schema: %w", err)
	}
	if !o.busyWarned.Load() && o.warnNoBusyTimeout(ctx, slog.Default(), "CreateSchema") {
		o.busyWarned.Store(true)
	}
	return nil
}

// warnNoBusyTimeout logs at Warn on log, and reports true, when o's
// database is a SQLite file whose connections have no busy timeout (a
// plain sql.Open("sqlite", path)): concurrent writers then fail with
// SQLITE_BUSY instead of waiting. where names the call.
func (o *Outbox) warnNoBusyTimeout(ctx context.Context, log *slog.Logger, where string) bool {
	if o.dialect != SQLite || !sqldb.NoBusyTimeout(ctx, o.db) {
		return false
	}
	log.Warn("outbox: "+where+": "+sqldb.NoBusyTimeoutAdvice, "table", o.table)
	return true
}

// Write inserts e as a pending outbox row inside tx, the caller's
// transaction: the row becomes visible to relays when, and only if, tx
// commits. It is one INSERT and no other write (on PostgreSQL the schema's
// statement trigger, unless WithNotify(false), queues a NOTIFY, delivered
// on commit, when a relay is idle: see WithNotify; under
// WithNotifyFromWrite, the INSERT's statement queues it itself, still one
// statement). It returns the event's ID (generated when e.ID is empty).
//
// Order: a key's events are published in insert order (Seq). On PostgreSQL,
// two transactions that write events of one key concurrently are ordered by
// when they inserted, not when they committed, and the relay may see the later
// one first: write a key's events in transactions that serialise on that key
// (update the entity's row before Write, which locks it), as a state change
// usually does. SQLite runs one write transaction at a time, so there insert
// order is commit order.
//
// Errors: ErrZeroOutbox, ErrNilContext, ErrNilTx, ErrInvalidEvent (wrapped),
// ErrDuplicateID (wrapped), ErrNoSchema (wrapped, with the database's
// error: a table or column missing on tx's connection: CreateSchema not
// run, or run on another connection of an in-memory SQLite database), ctx's
// error, or the database's (SQLite's SQLITE_BUSY on a connection without a
// busy timeout adds what to do: open the database with sqldb.OpenSQLite;
// SQLITE_BUSY_SNAPSHOT, which no busy timeout helps, says to run tx again
// and begin write transactions IMMEDIATE). The first four are returned before any SQL and
// leave tx untouched: it can go on (write a corrected event) and commit. The others come from the INSERT (ctx ending
// during it included): on PostgreSQL they abort tx (roll it back); on SQLite
// tx can go on. (database/sql also rolls tx back when the context given to
// BeginTx ends.)
func (o *Outbox) Write(ctx context.Context, tx *sql.Tx, e Event) (id string, err error) {
	if o.zero() {
		return "", ErrZeroOutbox
	}
	if ctx == nil {
		return "", keysched.ErrNilContext
	}
	if tx == nil {
		return "", ErrNilTx
	}
	if err := validate(&e); err != nil {
		return "", err
	}
	if e.ID == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return "", fmt.Errorf("outbox: generate event ID: %w", err)
		}
		e.ID = u.String()
	}
	if e.CreatedAt.IsZero() {
		e.CreatedAt = sqldb.Now()
	}
	headers, err := encodeHeaders(e.Headers)
	if err != nil {
		return "", err
	}
	payload := e.Payload
	if payload == nil {
		payload = []byte{}
	}
	// A plain Exec on the caller's transaction: preparing a statement on
	// the *sql.DB would need a second connection, which a pool of one
	// (common with SQLite) held by tx would never give.
	if _, err = tx.ExecContext(ctx, o.q.insert, e.ID, e.Key, e.Type, payload, headers, o.q.timeArg(e.CreatedAt)); err != nil {
		if sqldb.IsUniqueViolation(err) {
			return "", fmt.Errorf("%w: %q: %w", ErrDuplicateID, e.ID, err)
		}
		if sqldb.Classify(err) == sqldb.KindSchema {
			return "", fmt.Errorf("%w (table %s, its columns, or %s_idle under WithNotifyFromWrite): write event %q: %w", ErrNoSchema, o.table, o.table, e.ID, err)
		}
		// SQLITE_BUSY on a connection without a busy timeout says so.
		return "", fmt.Errorf("outbox: write event %q: %w", e.ID, sqldb.WithBusyTimeoutAdvice(ctx, tx, err))
	}
	return e.ID, nil
}

func validate(e *Event) error {
	if e.Key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidEvent)
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{{"ID", e.ID, MaxIDLen}, {"key", e.Key, MaxKeyLen}, {"type", e.Type, MaxTypeLen}} {
		if err := sqldb.CheckText(f.name, f.v, f.max); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
		}
	}
	for k, v := range e.Headers {
		// JSON (the headers' storage) holds text: encoding/json would
		// replace each invalid byte with U+FFFD, altering the value.
		if !utf8.ValidString(k) {
			return fmt.Errorf("%w: header name %q: invalid UTF-8", ErrInvalidEvent, k)
		}
		if !utf8.ValidString(v) {
			return fmt.Errorf("%w: header %q: invalid UTF-8 in its value", ErrInvalidEvent, k)
		}
	}
	return nil
}

// State is an outbox row's state.
type State int

// The row states. A row is written Pending; the relay makes it Sent (or
// deletes it, without retention) or Dead; Skip makes a Dead row Skipped and
// Resume makes it Pending again.
const (
	Pending State = 0
	Sent    State = 1
	Dead    State = 2
	Skipped State = 3
)

// String returns the state's name.
func (s State) String() string {
	switch s {
	case Pending:
		return "pending"
	case Sent:
		return "sent"
	case Dead:
		return "dead"
	case Skipped:
		return "skipped"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// A DeadEvent is an outbox row that a relay failed to publish for good.
type DeadEvent struct {
	Event
	// Attempts counts the failed sink calls of the row's attempt budgets
	// that ended in a dead mark, over all relays and Resumes. Calls whose
	// budget ended otherwise are not counted: those made under a lease that
	// was lost or ended, or given back at shutdown, and a budget whose dead
	// mark failed (the row then starts a new budget).
	Attempts int
	// Err is the last attempt's error, as text: at most 4096 bytes of
	// valid UTF-8, each NUL byte and invalid sequence replaced by U+FFFD
	// (as stored in the row).
	Err string
	// DiedAt is when the row was marked dead.
	DiedAt time.Time
}

// Dead returns up to limit dead rows (limit >= 1), oldest first: the events
// that failed for good and have been neither resumed nor skipped. Under the
// Park policy each such row stops its key.
func (o *Outbox) Dead(ctx context.Context, limit int) (_ []DeadEvent, err error) {
	defer func() { err = o.callErr(err) }()
	if o.zero() {
		return nil, ErrZeroOutbox
	}
	if ctx == nil {
		return nil, keysched.ErrNilContext
	}
	if limit < 1 {
		return nil, fmt.Errorf("outbox: Dead: limit %d < 1", limit)
	}
	rows, err := o.db.QueryContext(ctx, o.q.listDead, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead rows: %w", err)
	}
	defer rows.Close()
	var out []DeadEvent
	for rows.Next() {
		var d DeadEvent
		var headers sql.NullString
		var lastErr sql.NullString
		created, died := o.q.timeDest(), o.q.timeDest()
		if err := rows.Scan(&d.Seq, &d.ID, &d.Key, &d.Type, &d.Payload, &headers, created, &d.Attempts, &lastErr, died); err != nil {
			return nil, fmt.Errorf("outbox: list dead rows: %w", err)
		}
		d.CreatedAt, d.DiedAt = o.q.timeOf(created), o.q.timeOf(died)
		d.Err = lastErr.String
		if d.Headers, err = decodeHeaders(headers); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: list dead rows: %w", err)
	}
	return out, nil
}

// Parked returns the keys that have a dead row, sorted. Under the Park
// policy these keys are stopped until Resume or Skip. The outbox does not
// know its relays' policy: under Continue (the default) a key listed here
// is not stopped (its later rows were published past the dead one), and
// Dead lists the rows to resume or skip.
func (o *Outbox) Parked(ctx context.Context) (_ []string, err error) {
	defer func() { err = o.callErr(err) }()
	if o.zero() {
		return nil, ErrZeroOutbox
	}
	if ctx == nil {
		return nil, keysched.ErrNilContext
	}
	rows, err := o.db.QueryContext(ctx, o.q.parkedKeys)
	if err != nil {
		return nil, fmt.Errorf("outbox: parked keys: %w", err)
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, fmt.Errorf("outbox: parked keys: %w", err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: parked keys: %w", err)
	}
	return keys, nil
}

// Resume makes the key's oldest dead row pending again, so a relay publishes
// it (and, under Park, the key's later rows after it) with a fresh attempt
// budget. Its attempt count and last error are kept. It returns ErrNotParked
// when the key has no dead row, an error wrapping ErrInvalidKey for a key no
// event can have (see ErrInvalidKey). Under the Continue policy the key's later rows
// may have been published already: the resumed row then arrives after them.
// A connection broken, or ctx ended, while the move was in flight is an
// error wrapping ErrOutcomeUnknown: it may have taken effect.
func (o *Outbox) Resume(ctx context.Context, key string) error {
	_, err := o.moveDead(ctx, key, Pending, "")
	return err
}

// Skip gives up the key's oldest dead row for good (it becomes Skipped, with
// its error and attempts kept) so that, under Park, the key goes on with its
// next row. It returns ErrNotParked when the key has no dead row, an error
// wrapping ErrInvalidKey for a key no event can have (see ErrInvalidKey), and
// one wrapping ErrOutcomeUnknown when the connection broke, or ctx ended,
// while the move was in flight: it may have taken effect (look with Dead or
// Parked before a second Skip, which would give up the next dead row).
func (o *Outbox) Skip(ctx context.Context, key string) error {
	_, err := o.SkipHead(ctx, key)
	return err
}

// SkipHead is Skip that also returns the ID of the row it gave up, moved and
// named by one statement. (Reading the key's oldest dead row, then calling
// Skip, can name another row than the one skipped: the head may be resumed,
// published, and the next row die in between.) Errors as Skip's. An
// operator who decides from a view of the head (a page, a Dead listing)
// wants SkipEvent, which gives up only the row seen.
func (o *Outbox) SkipHead(ctx context.Context, key string) (id string, err error) {
	return o.moveDead(ctx, key, Skipped, "")
}

// SkipEvent gives up the key's oldest dead row (its head) for good, as Skip
// does, only if that row is the event id: the check and the move are one
// statement, so a head resumed, published and replaced by the next row's
// death after the caller looked (a stale page, a concurrent operator) is
// never given up in its place. Use it when an operator decides from what
// they saw.
//
// Errors: a *HeadChangedError (errors.Is ErrHeadChanged; its Head names the
// current head's ID) when the key's head is another row (id was given up
// or resumed meanwhile, or is not dead, or is no row of key), and nothing
// moved; ErrNotParked (wrapped) when the key has no dead row; ErrInvalidKey or ErrInvalidID (wrapped, before any SQL) for
// a key or an ID no event can have, ErrOutcomeUnknown (wrapped) when the
// connection broke, or ctx ended, while the move was in flight: it may
// have taken effect. Tried again after ErrOutcomeUnknown it is safe: a move
// that took effect makes the retry answer ErrHeadChanged or ErrNotParked,
// never give up the next row. Safe for concurrent use; of concurrent calls
// for one head, one moves it and the others get ErrHeadChanged or
// ErrNotParked.
func (o *Outbox) SkipEvent(ctx context.Context, key, id string) error {
	if o.zero() {
		return ErrZeroOutbox
	}
	if ctx == nil {
		return keysched.ErrNilContext
	}
	// Never "": moveDead would move whatever the head is.
	if id == "" {
		return fmt.Errorf("%w: empty ID", ErrInvalidID)
	}
	if err := sqldb.CheckText("ID", id, MaxIDLen); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	_, err := o.moveDead(ctx, key, Skipped, id)
	return err
}

// moveDead moves the key's oldest dead row to the state to and returns its
// ID; with want set (SkipEvent), only if that row is the event want.
func (o *Outbox) moveDead(ctx context.Context, key string, to State, want string) (_ string, err error) {
	defer func() { err = o.callErr(err) }()
	if o.zero() {
		return "", ErrZeroOutbox
	}
	if ctx == nil {
		return "", keysched.ErrNilContext
	}
	if key == "" {
		return "", fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if err := sqldb.CheckText("key", key, MaxKeyLen); err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	// On PostgreSQL (READ COMMITTED) two concurrent moves pick the same
	// oldest dead row; the second waits for the first's lock, then finds
	// the row no longer dead and moves nothing, while the key may have
	// more dead rows: ErrNotParked was reported for a key still parked.
	// So a move of nothing is retried while the key has a dead row (each
	// retry follows another caller's committed move: progress). With want,
	// a move of nothing is retried only while the key's head is still want
	// (it was moved away, and is dead again, between the two statements);
	// a head now another row is the caller's answer (ErrHeadChanged), and
	// no head ErrNotParked. The retries' bound (maxMoveTries) is the same:
	// each one follows a committed change of the key's dead rows.
	for range maxMoveTries {
		var id string
		live := ctx.Err() == nil
		if want == "" {
			err = o.db.QueryRowContext(ctx, o.q.moveDead, int(to), key, key).Scan(&id)
		} else {
			err = o.db.QueryRowContext(ctx, o.q.skipEvent, int(to), key, key, want).Scan(&id)
		}
		if err == nil {
			return id, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			if inFlight(ctx, live, err) {
				// An autocommit statement: the server may have
				// moved the row (and a Skip tried again would give
				// up the next one).
				return "", fmt.Errorf("outbox: %v key %q: %w (see Dead and Parked): %w", to, key, ErrOutcomeUnknown, err)
			}
			return "", fmt.Errorf("outbox: %v key %q: %w", to, key, err)
		}
		if want == "" {
			var one int
			err = o.db.QueryRowContext(ctx, o.q.hasDead, key).Scan(&one)
		} else {
			err = o.db.QueryRowContext(ctx, o.q.deadHead, key).Scan(&id)
		}
		if errors.Is(err, sql.ErrNoRows) {
			return "", fmt.Errorf("%w: %q", ErrNotParked, key)
		}
		if err != nil {
			return "", fmt.Errorf("outbox: %v key %q: %w", to, key, err)
		}
		if want != "" && id != want {
			return "", &HeadChangedError{Key: key, ID: want, Head: id}
		}
	}
	return "", fmt.Errorf("outbox: %v key %q: still contended after %d tries", to, key, maxMoveTries)
}

// callErr is the error err of an operator's call (Dead, Parked, Count,
// the moves, Recover) as returned: wrapping ErrNoSchema, naming the table,
// when the database says a table or column is missing (the database's
// error said only "no such table" or "relation does not exist"), and
// ErrDBClosed when the *sql.DB was closed.
func (o *Outbox) callErr(err error) error {
	if err != nil && !errors.Is(err, ErrNoSchema) && sqldb.Classify(err) == sqldb.KindSchema {
		return fmt.Errorf("%w (table %s): %w", ErrNoSchema, o.table, err)
	}
	return sqldb.WrapDBClosed(err)
}

// inFlight reports whether err, the error of a statement sent with ctx
// (live before the call), leaves its outcome unknown: the connection broke,
// or ctx ended, while it may have been in flight. A connection that could
// not be made (the server down or refusing connections), or an error pgx
// reports before sending anything, leaves nothing unknown.
func inFlight(ctx context.Context, live bool, err error) bool {
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) || pgconn.SafeToRetry(err) {
		return false
	}
	return sqldb.Classify(err) == sqldb.KindConnection || live && ctx.Err() != nil && !errors.Is(err, sql.ErrTxDone)
}

// HeadChangedError is SkipEvent's error when the key's dead head is not the
// event given (errors.Is(err, ErrHeadChanged) matches it). Head is the
// head's ID read just after the refused move: it may have changed again
// since.
type HeadChangedError struct {
	Key  string // the key given
	ID   string // the event given
	Head string // the key's oldest dead row's ID
}

func (e *HeadChangedError) Error() string {
	return fmt.Sprintf("outbox: the key's dead head is another event: key %q: its head (oldest dead row) is %q, not %q; nothing moved", e.Key, e.Head, e.ID)
}

// Is makes errors.Is(err, ErrHeadChanged) match.
func (e *HeadChangedError) Is(target error) bool { return target == ErrHeadChanged }

// maxMoveTries bounds moveDead's retries under contention.
const maxMoveTries = 1000

// Count returns how many rows are in each state (rows deleted when sent are
// not counted).
func (o *Outbox) Count(ctx context.Context) (_ map[State]int64, err error) {
	defer func() { err = o.callErr(err) }()
	if o.zero() {
		return nil, ErrZeroOutbox
	}
	if ctx == nil {
		return nil, keysched.ErrNilContext
	}
	rows, err := o.db.QueryContext(ctx, o.q.countStates)
	if err != nil {
		return nil, fmt.Errorf("outbox: count: %w", err)
	}
	defer rows.Close()
	out := map[State]int64{}
	for rows.Next() {
		var s int
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("outbox: count: %w", err)
		}
		out[State(s)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: count: %w", err)
	}
	return out, nil
}

// encodeHeaders is the headers column's value for h: nil (NULL) when h is
// empty, else h as a JSON object. decodeHeaders reads it back.
func encodeHeaders(h map[string]string) (any, error) {
	if len(h) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("%w: headers: %w", ErrInvalidEvent, err)
	}
	return string(b), nil
}

func decodeHeaders(h sql.NullString) (map[string]string, error) {
	if !h.Valid || h.String == "" {
		return nil, nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(h.String), &m); err != nil {
		return nil, fmt.Errorf("outbox: bad headers JSON %q: %w", h.String, err)
	}
	if len(m) == 0 {
		return nil, nil
	}
	return m, nil
}
