package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/sqldb"
)

// ErrInvalidFilter is wrapped by the error of Recover and Recoverable for a
// filter they refuse (see RecoverFilter), before any SQL.
var ErrInvalidFilter = errors.New("outbox: invalid recover filter")

// Bounds of a RecoverFilter.
const (
	// DefaultRecoverBatch is RecoverFilter.BatchSize's default: rows moved
	// per transaction.
	DefaultRecoverBatch = 500
	// MaxRecoverBatch bounds RecoverFilter.BatchSize.
	MaxRecoverBatch = 10000
	// MaxRecoverList bounds the number of Keys and of IDs of a filter.
	MaxRecoverList = 1000
)

// A RecoverFilter selects the dead (and, on request, skipped) rows an
// operator recovers with Recover, or lists with Recoverable. Every field set
// narrows the selection (they combine with AND); the zero filter selects
// every dead row.
type RecoverFilter struct {
	// States are the states selected: Dead, Skipped or both. Empty means
	// Dead only. Any other state is an ErrInvalidFilter.
	States []State
	// Keys, when not empty, selects these keys only (at most
	// MaxRecoverList, each a valid key: see ErrInvalidKey).
	Keys []string
	// IDs, when not empty, selects these event IDs only (at most
	// MaxRecoverList).
	IDs []string
	// Type, when not empty, selects rows of this event type (exact match).
	Type string
	// CreatedFrom and CreatedTo select rows written in [CreatedFrom,
	// CreatedTo) (Event.CreatedAt); a zero bound is open. From after To, or
	// a bound outside years 1 to 9999 (a far "max time": leave the bound
	// zero), is an ErrInvalidFilter.
	CreatedFrom, CreatedTo time.Time
	// DiedFrom and DiedTo select rows that failed (were marked dead) in
	// [DiedFrom, DiedTo), skipped rows included: a skipped row keeps the
	// time it was marked dead (Skip does not change it); a zero bound is
	// open; bounds as CreatedFrom's.
	DiedFrom, DiedTo time.Time
	// ErrorContains, when not empty, selects rows whose last error
	// contains it (case-sensitive substring, no wildcards).
	ErrorContains string
	// Limit bounds the rows moved (or listed) in all; 0 means no bound.
	// >= 0.
	Limit int
	// BatchSize is how many rows one transaction moves (Recover) or one
	// query lists (Recoverable): 0 means DefaultRecoverBatch; at most
	// MaxRecoverBatch.
	BatchSize int
}

// The times a RecoverFilter bound may take: years 1 to 9999 (UTC), which
// both databases store.
var (
	minFilterTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	maxFilterTime = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
)

// A RecoveredRow is a row Recover moved (or Recoverable would move), as it
// was before the move. Its payload and headers are not read.
type RecoveredRow struct {
	Seq       int64
	ID        string
	Key       string
	Type      string
	CreatedAt time.Time
	// State is the row's state before the move: Dead or Skipped.
	State State
	// Attempts and Err are the row's attempt count and last error; a
	// recovered row keeps both (as Resume does).
	Attempts int
	Err      string
	// DiedAt is when the row was marked dead (a skipped row's too: Skip
	// does not change it).
	DiedAt time.Time
}

// Recover is the operator's bulk form of Resume: it makes every dead row
// matching f (and skipped row, if f.States says so) pending again, in key
// order (then outbox order within a key), f.BatchSize rows per transaction,
// and returns the rows it moved, in that order. Each moved row keeps its
// attempt count and last error and gets a fresh attempt budget from the
// relay that publishes it.
//
// Under the Park policy a key is stopped while it has a dead row: once its
// dead head is recovered (and no other dead row of the key is left), the
// key resumes, the recovered row first and the key's later rows after it.
// A recovered row that is behind the cursor of a relay holding its key (a
// skipped row, after the key went on; or a dead row under Continue) is
// published at that relay's next fetch of the key with nothing of it in
// flight: such a key, lingering or not, is read from its oldest pending row.
// That is the relay's next poll (WithPollInterval at most; the Relay's
// Recover wakes its relay at once), or, while the key's later rows are in
// flight, the first poll after they have settled (a key kept busy for a
// lease duration, WithLeaseDuration, is released and claimed afresh, from
// its oldest pending row). The row then arrives after the key's rows
// already published. A key no relay holds is read from its oldest pending
// row by the relay that next claims it.
//
// Concurrency: each batch selects its rows, locks them (PostgreSQL: FOR
// UPDATE; SQLite: the write transaction) and moves those still in a
// selected state; a row moved by a concurrent Resume, Skip or Recover in
// between is left out, never moved twice. Rows that come to match after
// the walk passed their key are not moved.
//
// Errors: ErrZeroOutbox, ErrNilContext, ErrInvalidFilter or ErrInvalidKey
// (wrapped, before any SQL), or a database error (ctx's included): the
// batches committed before it stay moved and are returned with the error.
// When the connection broke, or ctx ended, during a batch's COMMIT, the
// error wraps ErrOutcomeUnknown and names the batch: its rows may have
// moved (they are not returned).
func (o *Outbox) Recover(ctx context.Context, f RecoverFilter) ([]RecoveredRow, error) {
	return o.recover(ctx, f, false)
}

// Recoverable is Recover's dry run: it returns the rows Recover would move
// with f, in the same order, and moves nothing. Its errors are Recover's.
// Rows may change state between a Recoverable and a Recover.
func (o *Outbox) Recoverable(ctx context.Context, f RecoverFilter) ([]RecoveredRow, error) {
	return o.recover(ctx, f, true)
}

// Recover is Outbox.Recover that also wakes the relay (after an error
// wrapping ErrOutcomeUnknown too: see Relay.Resume). After Close it returns
// ErrClosed and moves nothing (Outbox.Recover needs no relay).
func (r *Relay) Recover(ctx context.Context, f RecoverFilter) ([]RecoveredRow, error) {
	if r.zero() {
		return nil, ErrZeroRelay
	}
	if r.closed() {
		return nil, ErrClosed
	}
	moved, err := r.o.Recover(ctx, f)
	if len(moved) > 0 {
		r.signal()
	}
	if errors.Is(err, ErrOutcomeUnknown) {
		r.signalIfMoved(err)
	}
	return moved, err
}

// recoverQuery is one batch's SELECT for f, and its arguments after the
// cursor's.
func (o *Outbox) recoverQuery(f *RecoverFilter) (where string, args []any, err error) {
	var b strings.Builder
	states := f.States
	if len(states) == 0 {
		states = []State{Dead}
	}
	seen := map[State]bool{}
	b.WriteString("state IN (")
	for i, s := range states {
		if s != Dead && s != Skipped {
			return "", nil, fmt.Errorf("%w: state %v: only dead and skipped rows are recovered", ErrInvalidFilter, s)
		}
		if seen[s] {
			return "", nil, fmt.Errorf("%w: state %v given twice", ErrInvalidFilter, s)
		}
		seen[s] = true
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d", int(s))
	}
	b.WriteString(")")
	list := func(col string, vals []string) {
		b.WriteString(" AND " + col + " IN (")
		for i, v := range vals {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteByte('?')
			args = append(args, v)
		}
		b.WriteString(")")
	}
	if len(f.Keys) > MaxRecoverList || len(f.IDs) > MaxRecoverList {
		return "", nil, fmt.Errorf("%w: %d keys and %d IDs: at most %d of each", ErrInvalidFilter, len(f.Keys), len(f.IDs), MaxRecoverList)
	}
	for _, k := range f.Keys {
		if k == "" {
			return "", nil, fmt.Errorf("%w: empty key", ErrInvalidKey)
		}
		if err := sqldb.CheckText("key", k, MaxKeyLen); err != nil {
			return "", nil, fmt.Errorf("%w: %w", ErrInvalidKey, err)
		}
	}
	if len(f.Keys) > 0 {
		list("key", f.Keys)
	}
	for _, id := range f.IDs {
		if id == "" {
			return "", nil, fmt.Errorf("%w: empty ID", ErrInvalidFilter)
		}
		if err := sqldb.CheckText("ID", id, MaxIDLen); err != nil {
			return "", nil, fmt.Errorf("%w: %w", ErrInvalidFilter, err)
		}
	}
	if len(f.IDs) > 0 {
		list("id", f.IDs)
	}
	if f.Type != "" {
		if err := sqldb.CheckText("type", f.Type, MaxTypeLen); err != nil {
			return "", nil, fmt.Errorf("%w: %w", ErrInvalidFilter, err)
		}
		b.WriteString(" AND type = ?")
		args = append(args, f.Type)
	}
	for _, r := range []struct {
		col      string
		from, to time.Time
	}{{"created_at", f.CreatedFrom, f.CreatedTo}, {"done_at", f.DiedFrom, f.DiedTo}} {
		if !r.from.IsZero() && !r.to.IsZero() && r.from.After(r.to) {
			return "", nil, fmt.Errorf("%w: %s range from %v after to %v", ErrInvalidFilter, r.col, r.from.Format(time.RFC3339Nano), r.to.Format(time.RFC3339Nano))
		}
		// A far bound (time.Unix(1<<62, 0), a "max time") overflowed
		// SQLite's microseconds and PostgreSQL's timestamps: an open
		// upper bound selected nothing.
		for _, t := range []time.Time{r.from, r.to} {
			if !t.IsZero() && (t.Before(minFilterTime) || !t.Before(maxFilterTime)) {
				return "", nil, fmt.Errorf("%w: %s bound %v: need a time in years 1 to 9999 (a zero time for an open bound)", ErrInvalidFilter, r.col, t.Format(time.RFC3339Nano))
			}
		}
		if !r.from.IsZero() {
			b.WriteString(" AND " + r.col + " >= ?")
			args = append(args, o.q.timeArg(r.from))
		}
		if !r.to.IsZero() {
			b.WriteString(" AND " + r.col + " < ?")
			args = append(args, o.q.timeArg(r.to))
		}
	}
	if f.ErrorContains != "" {
		if err := sqldb.CheckText("error text", f.ErrorContains, 4096); err != nil {
			return "", nil, fmt.Errorf("%w: %w", ErrInvalidFilter, err)
		}
		if o.dialect == Postgres {
			b.WriteString(" AND strpos(last_error, ?) > 0")
		} else {
			b.WriteString(" AND instr(last_error, ?) > 0")
		}
		args = append(args, f.ErrorContains)
	}
	if f.Limit < 0 {
		return "", nil, fmt.Errorf("%w: Limit %d < 0", ErrInvalidFilter, f.Limit)
	}
	if f.BatchSize < 0 || f.BatchSize > MaxRecoverBatch {
		return "", nil, fmt.Errorf("%w: BatchSize %d: need 0 (default %d) to %d", ErrInvalidFilter, f.BatchSize, DefaultRecoverBatch, MaxRecoverBatch)
	}
	return b.String(), args, nil
}

func (o *Outbox) recover(ctx context.Context, f RecoverFilter, dry bool) (_ []RecoveredRow, err error) {
	defer func() { err = o.callErr(err) }()
	if o.zero() {
		return nil, ErrZeroOutbox
	}
	if ctx == nil {
		return nil, keysched.ErrNilContext
	}
	where, args, err := o.recoverQuery(&f)
	if err != nil {
		return nil, err
	}
	batch := f.BatchSize
	if batch == 0 {
		batch = DefaultRecoverBatch
	}
	sel := `SELECT seq, id, key, type, created_at, state, attempts, last_error, done_at FROM ` + o.table +
		` WHERE (key > ? OR (key = ? AND seq > ?)) AND ` + where + ` ORDER BY key, seq LIMIT ?`
	if o.dialect == Postgres && !dry {
		sel += ` FOR UPDATE`
	}
	sel = sqldb.Rebind(o.dialect, sel)
	what := "recover"
	if dry {
		what = "list recoverable rows"
	}
	var (
		out      []RecoveredRow
		afterKey string
		afterSeq int64 = -1 << 62
	)
	for {
		n := batch
		if f.Limit > 0 {
			n = min(n, f.Limit-len(out))
			if n == 0 {
				return out, nil
			}
		}
		var moved []RecoveredRow
		var scanned int
		if dry {
			moved, err = o.recoverSelect(ctx, o.db, sel, afterKey, afterSeq, args, n)
			scanned = len(moved)
		} else {
			moved, scanned, err = o.recoverBatch(ctx, sel, afterKey, afterSeq, args, n, &afterKey, &afterSeq)
		}
		if err != nil {
			return out, fmt.Errorf("outbox: %s: %w", what, err)
		}
		if scanned == 0 {
			return out, nil
		}
		if dry {
			afterKey, afterSeq = moved[len(moved)-1].Key, moved[len(moved)-1].Seq
		}
		out = append(out, moved...)
	}
}

type queryer interface {
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
}

// recoverSelect reads one batch of matching rows after the cursor. A batch
// that comes back short of n because rows changed state meanwhile is fine:
// the walk stops only at an empty batch.
func (o *Outbox) recoverSelect(ctx context.Context, q queryer, sel, afterKey string, afterSeq int64, args []any, n int) ([]RecoveredRow, error) {
	all := append([]any{afterKey, afterKey, afterSeq}, args...)
	all = append(all, n)
	rows, err := q.QueryContext(ctx, sel, all...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []RecoveredRow
	for rows.Next() {
		var r RecoveredRow
		var st int
		var lastErr sql.NullString
		created, died := o.q.timeDest(), o.q.timeDest()
		if err := rows.Scan(&r.Seq, &r.ID, &r.Key, &r.Type, created, &st, &r.Attempts, &lastErr, died); err != nil {
			return nil, err
		}
		r.State, r.Err = State(st), lastErr.String
		r.CreatedAt, r.DiedAt = o.q.timeOf(created), o.q.timeOf(died)
		out = append(out, r)
	}
	return out, rows.Err()
}

// recoverBatch moves one batch in one transaction: the rows selected (and,
// on PostgreSQL, locked) and still dead or skipped are made pending. It
// returns the rows moved and how many were selected, and advances the
// cursor past the batch.
func (o *Outbox) recoverBatch(ctx context.Context, sel, afterKey string, afterSeq int64, args []any, n int, curKey *string, curSeq *int64) (moved []RecoveredRow, scanned int, err error) {
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, 0, err
	}
	defer tx.Rollback()
	rows, err := o.recoverSelect(ctx, tx, sel, afterKey, afterSeq, args, n)
	if err != nil || len(rows) == 0 {
		return nil, 0, err
	}
	// The seqs moved, each named by one statement (RETURNING), so that a
	// row that left the dead and skipped states between the SELECT and
	// here (SQLite cannot: its write transaction excludes others) is not
	// reported as moved.
	var b strings.Builder
	b.WriteString(`UPDATE ` + o.table + ` SET state = 0 WHERE state IN (2, 3) AND seq IN (`)
	seqs := make([]any, len(rows))
	for i, r := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('?')
		seqs[i] = r.Seq
	}
	b.WriteString(`) RETURNING seq`)
	res, err := tx.QueryContext(ctx, sqldb.Rebind(o.dialect, b.String()), seqs...)
	if err != nil {
		return nil, 0, err
	}
	done := map[int64]bool{}
	for res.Next() {
		var s int64
		if err := res.Scan(&s); err != nil {
			res.Close()
			return nil, 0, err
		}
		done[s] = true
	}
	if err := res.Err(); err != nil {
		return nil, 0, err
	}
	res.Close()
	if o.beforeRecoverCommit != nil {
		o.beforeRecoverCommit()
	}
	live := ctx.Err() == nil
	if err := tx.Commit(); err != nil {
		if inFlight(ctx, live, err) {
			return nil, 0, fmt.Errorf("%w: a batch of %d rows (key %q seq %d to key %q seq %d) may have moved (see Recoverable): %w",
				ErrOutcomeUnknown, len(done), rows[0].Key, rows[0].Seq, rows[len(rows)-1].Key, rows[len(rows)-1].Seq, err)
		}
		return nil, 0, err
	}
	*curKey, *curSeq = rows[len(rows)-1].Key, rows[len(rows)-1].Seq
	for _, r := range rows {
		if done[r.Seq] {
			moved = append(moved, r)
		}
	}
	return moved, len(rows), nil
}
