package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"

	"github.com/keysched/keysched/internal/optcheck"
)

// A Marked is a row that a relay's mark transaction has just marked, as
// handed to a MarkHook: sent (State Sent; with WithRetention 0 the row is
// deleted by the same transaction) or dead (State Dead).
type Marked struct {
	Event Event // the row as the sink got it
	Claim Claim // the claim it was published under (the one that marked it)
	State State // Sent or Dead
	// Attempts and Err are the dead mark's: the failed calls it counts and
	// the last error as stored (DeadEvent.Err). Zero for Sent.
	Attempts int
	Err      string
	// Note is what the row's last sink call gave SetMarkNote (nil if
	// nothing): a value the sink hands to the hook, such as the call's
	// record.
	Note any
}

// A MarkHook runs inside the transaction that marks rows sent or dead, after
// the marking statement, with the rows it marked (see WithMarkHook). Its
// writes through tx commit or roll back with the marks.
type MarkHook func(ctx context.Context, tx *sql.Tx, marked []Marked) error

// WithMarkHook makes the relay run fn inside each transaction that marks
// published rows sent (or deleted, without WithRetention) and each that
// marks a row dead, so that the caller's own writes (an audit or delivery
// record, a counter) commit if and only if the marks do.
//
// When: the relay marks published rows in batches (each batch one
// transaction, on one goroutine) and each dead row in a transaction of its
// own (on the worker that ran the row). fn is called once the marking
// statement has run, with the rows that statement marked, in publish order
// for a batch, one row for a dead mark. The statement only marks rows
// still under the claim they were published under (key, epoch, name,
// token: see WithOwner): rows on a key whose lease another relay took are
// not marked and are not given to fn. A transaction that marked nothing
// (every row fenced) does not call fn. fn is not called for rows that no
// mark transaction covers (a relay that crashed, or was fenced, before its
// mark).
//
// Errors: if fn returns an error, the transaction rolls back: the rows
// stay pending, and whatever fn wrote through tx is undone. A sent batch
// is then marked again, fn called again, every poll interval (the rows
// stay held in flight, their key's lease renewed, so no relay publishes
// them again meanwhile) until it succeeds, the claim is lost (then the rows are not marked: the key's next
// holder publishes them again) or the relay shuts down (Run's last mark
// fails the same way: the rows stay pending, are published again once the
// leases are released, and Close reports them unmarked). A dead row whose
// mark fails stays pending and its key is claimed afresh: the row is
// published (and fails) again. Each error is counted and logged as a failed
// mark (RelayStats.DBErrors, op "mark rows sent" or "mark row dead"),
// wrapped as "mark hook: ...". A commit that fails after fn returned nil
// undoes fn's writes as well. A panic in fn is recovered and is fn's error
// ("mark hook: panic: ..."): the transaction rolls back, as above.
//
// Rules for fn: write through tx only (writes through the *sql.DB are not
// part of the transaction and, on SQLite, wait for the write lock that tx
// holds: a deadlock until the busy timeout); keep it quick (it holds the
// marks' locks, the whole database's write lock on SQLite, and the next
// batch waits); do not commit or roll back tx; ctx is the mark's, bounded
// like the mark (a third of the lease, at least 5 s for sent rows). A
// commit whose answer is lost (the connection dropped during COMMIT) may
// have taken effect with fn's writes: the relay then counts the rows as
// not marked (lease lost) and does not run fn's AfterMarkCommit functions.
// fn is called from the relay's mark goroutine and, for dead rows, from its
// workers, concurrently: it must be safe for concurrent use. Work that must follow
// the commit (in-memory bookkeeping, metrics) goes to AfterMarkCommit.
// A nil fn is refused with a *keysched.OptionError (errors.Is
// ErrInvalidOption).
func WithMarkHook(fn MarkHook) RelayOption {
	return func(c *relayConfig) error {
		if r := optcheck.NotNil("WithMarkHook", fn == nil, "a function"); r != nil {
			return refused(r)
		}
		c.markHook = fn
		return nil
	}
}

// noteSlot is where a sink call's SetMarkNote goes: the job's current call.
type noteSlot struct{ v atomic.Pointer[any] }

type noteKey struct{}

// SetMarkNote attaches v to the row of the sink call whose context is ctx,
// for the relay's MarkHook (Marked.Note), replacing what an earlier call
// (or an earlier attempt of the row) set. Call it before the sink returns;
// a call after that may or may not be seen. It reports whether ctx is a
// sink call's (false for any other context, nil included; then it does
// nothing). Safe for concurrent use.
func SetMarkNote(ctx context.Context, v any) bool {
	if ctx == nil {
		return false
	}
	s, ok := ctx.Value(noteKey{}).(*noteSlot)
	if !ok {
		return false
	}
	s.v.Store(&v)
	return true
}

func (s *noteSlot) get() any {
	if p := s.v.Load(); p != nil {
		return *p
	}
	return nil
}

// afterCommit collects the functions a MarkHook registers.
type afterCommit struct{ fns []func() }

type afterKey struct{}

// AfterMarkCommit registers fn to run once the mark transaction whose
// MarkHook got ctx has committed, on the goroutine that committed it,
// after the commit and in registration order; fn does not run if the
// transaction rolls back or its commit fails. It reports whether ctx is a
// MarkHook's (false otherwise, nil included; then fn never runs). Call it
// from the hook, not from goroutines it starts. A nil fn is ignored. A
// panic in fn is recovered and logged (the marks stay committed) and the
// next function runs.
func AfterMarkCommit(ctx context.Context, fn func()) bool {
	if ctx == nil {
		return false
	}
	a, ok := ctx.Value(afterKey{}).(*afterCommit)
	if !ok {
		return false
	}
	if fn != nil {
		a.fns = append(a.fns, fn)
	}
	return true
}

// runHook runs the relay's MarkHook in tx for marked (nothing when there is
// no hook or nothing was marked) and returns the functions to run once tx
// has committed.
func (r *Relay) runHook(ctx context.Context, tx *sql.Tx, marked []Marked) (fns []func(), err error) {
	if r.cfg.markHook == nil || len(marked) == 0 {
		return nil, nil
	}
	defer func() {
		// A panic is the hook's failure: the marks roll back like on its
		// error. Unrecovered, it would end the process from the flusher,
		// and, from a dead mark (under keysched's dead-letter recovery),
		// strand the row in flight with its key held for good.
		if p := recover(); p != nil {
			fns, err = nil, &hookError{fmt.Errorf("panic: %v", p)}
		}
	}()
	a := &afterCommit{}
	if err := r.cfg.markHook(context.WithValue(ctx, afterKey{}, a), tx, marked); err != nil {
		return nil, &hookError{err}
	}
	return a.fns, nil
}

// hookError is a MarkHook's error, as the relay logs and counts it.
type hookError struct{ err error }

func (e *hookError) Error() string { return "mark hook: " + e.err.Error() }
func (e *hookError) Unwrap() error { return e.err }

// runAfter runs a committed mark's AfterMarkCommit functions, in order. A
// panic is recovered and logged, and the next function runs: the marks are
// committed, and the relay must still settle the rows (unrecovered, on a
// dead mark under keysched's dead-letter recovery, the row's job would stay
// in flight and its key held for good).
func (r *Relay) runAfter(fns []func()) {
	for _, fn := range fns {
		func() {
			defer func() {
				if p := recover(); p != nil {
					r.log.Error("outbox relay: an AfterMarkCommit function panicked (its marks are committed)", "table", r.o.table, "panic", p)
				}
			}()
			fn()
		}()
	}
}
