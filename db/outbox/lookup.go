package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/sqldb"
)

var (
	// ErrNotFound is wrapped by Lookup's error when the outbox has no row
	// with the ID. With the default retention (WithRetention 0) a row is
	// deleted as soon as it is marked sent, so "not found" means sent and
	// deleted, or never written (or its transaction has not committed, or
	// rolled back); a relay made WithRetention(d) keeps sent rows for d
	// (Lookup then says Sent), then deletes them.
	ErrNotFound = errors.New("outbox: no event with this ID (sent and deleted, or never written)")
	// ErrInvalidID is wrapped by Lookup's and SkipEvent's error for an ID no event can
	// have: empty, longer than MaxIDLen bytes, or with a NUL byte or
	// invalid UTF-8. It is returned before any SQL.
	ErrInvalidID = errors.New("outbox: invalid event ID")
)

// An EventStatus is what the outbox holds about one event: see Lookup. It
// is a snapshot: the row may move on (be published, die, be resumed) at
// once.
type EventStatus struct {
	ID   string
	Key  string
	Type string
	// Seq is the row's position in the outbox (see Event.Seq).
	Seq int64
	// State is Pending (not published yet, or resumed or recovered), Sent
	// (published and kept by WithRetention), Dead (failed for good, see
	// Outbox.Dead) or Skipped (given up by Skip or SkipHead).
	State State
	// Attempts is the row's attempt count as the outbox stores it: the
	// relay adds a round's sink calls when it marks the row dead, so it
	// sums the rounds that ended dead, over all relays, Resumes and
	// recoveries (as DeadEvent.Attempts); a row published after retries
	// within its budget counts none of them. Err is the last death's
	// error, as text ("" if it never died).
	Attempts int
	Err      string
	// CreatedAt is the event's Event.CreatedAt.
	CreatedAt time.Time
	// DoneAt is when the row was marked sent or dead; zero for a row
	// never marked. A skipped row, and a row resumed or recovered (Pending
	// again), keeps the time it died (Skip and SkipHead do not change it:
	// TestSkippedRowKeepsItsDeathTime).
	DoneAt time.Time
	// Ahead, for a Pending row, counts the rows of its key before it (a
	// lower Seq) that are still pending: the relay publishes them first.
	// DeadAhead counts the dead rows of its key before it: under the Park
	// policy the key is stopped until each is resumed or skipped (under
	// Continue the relay has gone past them). Both are 0 for a row in
	// another state.
	Ahead     int64
	DeadAhead int64
}

// Lookup answers the operator's "what happened to event id": the state of
// the outbox row with that ID, its key, type, seq, attempts, last error and
// times, and, for a pending row, how many rows of its key are ahead of it.
// It is one query (the ID's unique index, and for a pending row two counts
// over the key's rows before it: an index range scan each, proportional to
// their number). It reads committed rows only, and takes no lock.
//
// Errors: ErrZeroOutbox, ErrNilContext, ErrInvalidID (wrapped, before any
// SQL), ErrNotFound (wrapped) when no row has the ID (with the default
// retention a sent row is deleted: see ErrNotFound), ErrNoSchema (wrapped)
// when the table is missing, or the database's error (ctx's included).
// With an error the EventStatus is the zero value, whose State reads
// Pending (State's zero): look at the error first.
func (o *Outbox) Lookup(ctx context.Context, id string) (_ EventStatus, err error) {
	defer func() { err = sqldb.WrapDBClosed(err) }()
	if o.zero() {
		return EventStatus{}, ErrZeroOutbox
	}
	if ctx == nil {
		return EventStatus{}, keysched.ErrNilContext
	}
	if id == "" {
		return EventStatus{}, fmt.Errorf("%w: empty ID", ErrInvalidID)
	}
	if err := sqldb.CheckText("ID", id, MaxIDLen); err != nil {
		return EventStatus{}, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	s := EventStatus{ID: id}
	var st int
	var lastErr sql.NullString
	created, done := o.q.timeDest(), o.q.timeDest()
	err = o.db.QueryRowContext(ctx, o.q.lookup, id).Scan(&s.Seq, &s.Key, &s.Type, created, &st, &s.Attempts, &lastErr, done, &s.Ahead, &s.DeadAhead)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return EventStatus{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	case err != nil && sqldb.Classify(err) == sqldb.KindSchema:
		return EventStatus{}, fmt.Errorf("%w (table %s): look up event %q: %w", ErrNoSchema, o.table, id, err)
	case err != nil:
		return EventStatus{}, fmt.Errorf("outbox: look up event %q: %w", id, err)
	}
	s.State, s.Err = State(st), lastErr.String
	s.CreatedAt, s.DoneAt = o.q.timeOf(created), o.q.timeOf(done)
	return s, nil
}

// lookupQuery is Lookup's statement for table t, with a ? placeholder.
func lookupQuery(t string) string {
	ahead := func(state int) string {
		return fmt.Sprintf(`CASE WHEN o.state = 0 THEN (SELECT COUNT(*) FROM %s x WHERE x.key = o.key AND x.state = %d AND x.seq < o.seq) ELSE 0 END`, t, state)
	}
	return `SELECT o.seq, o.key, o.type, o.created_at, o.state, o.attempts, o.last_error, o.done_at, ` +
		ahead(int(Pending)) + `, ` + ahead(int(Dead)) + ` FROM ` + t + ` o WHERE o.id = ?`
}
