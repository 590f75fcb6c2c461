package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/keysched/keysched/db/internal/schemacheck"
	"github.com/keysched/keysched/db/sqldb"
	"github.com/keysched/keysched/internal/optcheck"
)

// Versions gates writes on an entity's version: one row per entity (its
// key and the highest version applied), so an event whose version is not
// newer than the stored one (a duplicate, or an older event redelivered
// after a newer one) is ignored. Unlike Inbox it keeps no row per event and
// needs no retention, but it needs a version that grows with each change of
// the entity: a sequence number per entity, the outbox's Event.Seq of the
// events of one key, the source row's version column.
//
// Safe for concurrent use.
//
// The zero Versions is not usable: use NewVersions. The methods of a nil or
// zero Versions return ErrZeroVersions (those with an error result) or zero
// values, and touch no database.
type Versions struct {
	db         *sql.DB
	o          options
	gate, read string
	busy       *inFlight // the entities of the Applys running
}

// NewVersions returns a Versions on db (table DefaultVersionsTable unless
// WithTable). It does not touch the database: create the table with
// CreateSchema. WithRetention is refused: versions never expire.
//
// SQLite: db needs the settings sqldb.OpenSQLite gives (WAL, a busy timeout,
// immediate transactions): see New.
func NewVersions(db *sql.DB, opts ...Option) (*Versions, error) {
	o, err := build(db, DefaultVersionsTable, opts)
	if err != nil {
		return nil, err
	}
	if o.retention != 0 {
		return nil, refused(optcheck.Refuse("WithRetention", o.retention, "does not apply to Versions: versions never expire"))
	}
	v := &Versions{db: db, o: o, busy: newInFlight()}
	t := o.table
	v.gate = sqldb.Rebind(o.dialect, `INSERT INTO `+t+` (entity, version) VALUES (?, ?)
	ON CONFLICT (entity) DO UPDATE SET version = excluded.version WHERE `+t+`.version < excluded.version
	RETURNING version`)
	v.read = sqldb.Rebind(o.dialect, `SELECT version FROM `+t+` WHERE entity = ?`)
	return v, nil
}

// Schema returns the SQL that creates the versions table (idempotent), nil
// for a nil or zero Versions.
func (v *Versions) Schema() []string {
	if v.zero() {
		return nil
	}
	return []string{`CREATE TABLE IF NOT EXISTS ` + v.o.table + ` (entity TEXT PRIMARY KEY, version BIGINT NOT NULL)`}
}

// zero reports a nil Versions or one not made by NewVersions.
func (v *Versions) zero() bool { return v == nil || v.db == nil }

// CreateSchema runs Schema's statements in one transaction; concurrent calls take
// turns, as Inbox.CreateSchema's do.
func (v *Versions) CreateSchema(ctx context.Context) error {
	if v.zero() {
		return ErrZeroVersions
	}
	if ctx == nil {
		return ErrNilContext
	}
	return createSchema(ctx, v.db, v.o.dialect, "the versions table "+v.o.table, []schemacheck.Object{
		{Name: v.o.table, Kind: schemacheck.Table, Columns: []string{"entity", "version"}},
	}, v.Schema())
}

// Apply runs fn in a transaction only if version is newer than the version
// stored for entity (or none is stored), storing version in the same
// transaction. Results:
//   - (true, nil): version was newer; fn ran and committed with it.
//   - (false, nil): version is not newer (a duplicate or an out-of-order
//     redelivery): fn did not run, nothing was written.
//   - (false, err): fn's error (as is), a database error or ctx's; nothing
//     was written. Two exceptions: an error wrapping ErrTxEnded: fn
//     committed or rolled back tx itself (a bug in fn); if it committed,
//     the version and fn's writes before the commit are stored, and the
//     error says so (or, when a newer version was stored since, that
//     whether fn committed is unknown). And an error wrapping
//     ErrCommitUnknown: the connection broke, or ctx ended, during the
//     commit, which may have taken effect (the version is stored if and
//     only if fn's writes are).
//
// Concurrent Applys on one entity serialise on its row: the newest version
// wins, whatever the arrival order, and each version's fn runs at most once.
// On PostgreSQL under REPEATABLE READ or SERIALIZABLE, a gate that fails
// with a serialization failure (the row changed since the snapshot) begins
// a new transaction, fn not having run, up to 100 in all, as Inbox.Apply's
// insert does.
// A panic in fn rolls back and is re-raised. fn must not call Apply for the
// same entity: as a nested Inbox.Apply of one ID, it waits for its own
// transaction until ctx ends (SQLite: or the busy timeout), and its error
// then says so.
func (v *Versions) Apply(ctx context.Context, entity string, version int64, fn func(tx *sql.Tx) error) (applied bool, err error) {
	if v.zero() {
		return false, ErrZeroVersions
	}
	if ctx == nil {
		return false, ErrNilContext
	}
	if fn == nil {
		return false, ErrNilFunc
	}
	if err := validID(entity); err != nil {
		return false, err
	}
	others, leave := v.busy.enter(entity)
	defer leave()
	defer func() { err = selfWait(ctx, v.o.dialect, err, others, "entity", entity) }()
	return runTx(ctx, v.db, func(tx *sql.Tx) (bool, error) {
		newer, err := v.Gate(ctx, tx, entity, version)
		if err != nil || !newer {
			return false, gateConflict(v.o.dialect, err)
		}
		return true, fn(tx)
	}, func(ctx context.Context) string {
		if cur, ok, err := v.Current(ctx, entity); err != nil {
			return fmt.Sprintf("whether version %d of %q is stored is unknown: %v", version, entity, err)
		} else if ok && cur == version {
			return fmt.Sprintf("%q is at version %d: fn committed", entity, cur)
		} else if ok && cur > version {
			// A newer version was stored since: whether this one's
			// commit took effect before it cannot be told from here.
			return fmt.Sprintf("%q is at version %d, newer than %d: whether fn committed is unknown", entity, cur, version)
		}
		return fmt.Sprintf("version %d of %q is not stored", version, entity)
	})
}

// Gate stores version for entity inside tx, the caller's transaction, if it
// is newer than the stored one, and reports whether it was. On false, skip
// the write (or roll back). On PostgreSQL it locks the entity's row until tx
// ends; under REPEATABLE READ or SERIALIZABLE it fails with a serialization
// failure (SQLSTATE 40001) when the row changed since tx's snapshot: roll tx
// back and begin again (Apply does).
func (v *Versions) Gate(ctx context.Context, tx *sql.Tx, entity string, version int64) (newer bool, err error) {
	if v.zero() {
		return false, ErrZeroVersions
	}
	if ctx == nil {
		return false, ErrNilContext
	}
	if tx == nil {
		return false, ErrNilTx
	}
	if err := validID(entity); err != nil {
		return false, err
	}
	var got int64
	err = tx.QueryRowContext(ctx, v.gate, entity, version).Scan(&got)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, noSchema(v.o.table, fmt.Errorf("inbox: version gate %q: %w", entity, err))
	}
	return true, nil
}

// Current returns the version stored for entity; ok is false when none is.
// An entity no Apply accepts (see ErrInvalidID) is ErrInvalidID.
func (v *Versions) Current(ctx context.Context, entity string) (version int64, ok bool, err error) {
	if v.zero() {
		return 0, false, ErrZeroVersions
	}
	if ctx == nil {
		return 0, false, ErrNilContext
	}
	if err := validID(entity); err != nil {
		return 0, false, err
	}
	err = v.db.QueryRowContext(ctx, v.read, entity).Scan(&version)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, noSchema(v.o.table, fmt.Errorf("inbox: version of %q: %w", entity, err))
	}
	return version, true, nil
}
