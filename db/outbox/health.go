package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keysched/keysched/db/sqldb"
)

// DBErrorCounts counts a relay's failed database calls by kind (see
// sqldb.Classify): each field is a kind.
type DBErrorCounts struct {
	Connection uint64 // connection refused, broken or terminated: the server restarting, down, unreachable
	Timeout    uint64 // statement_timeout, lock_timeout, or the relay's own bound on a call
	Conflict   uint64 // deadlock, serialization failure, SQLite busy or locked
	Schema     uint64 // a table or column missing
	Storage    uint64 // the database cannot write: read-only (a standby, a read-only SQLite file), a failing or full disk
	Other      uint64 // anything else
}

// health follows whether the relay's database calls fail, to log one line
// per change of state (failing, still failing, recovered) rather than one
// per failed call, and to bound an outage (WithMaxOutage).
type health struct {
	kinds [sqldb.NumErrorKinds]atomic.Uint64
	total atomic.Uint64 // failed calls, for "no failure during this poll"

	mu sync.Mutex
	// bad holds the groups of calls (see opGroup) whose last call failed;
	// the database has recovered when none is left.
	bad     map[string]bool
	failing bool
	since   time.Time // first failure since the last success
	tries   int       // failed calls since then
	next    int       // tries at which the next "still failing" line is logged
	lastOp  string
	lastErr error
}

// stillFailingFirst is the number of failed calls after which a relay whose
// database keeps failing logs "still failing"; it logs again at 10 times that
// number, then 100 times, and so on.
const stillFailingFirst = 10

// dbError counts a failed database call and logs a change of state: the
// first failure after a success ("database failing"), and the 10th, 100th,
// 1000th... failure in a row ("still failing", with the last error).
func (r *Relay) dbError(what string, err error) {
	if sqldb.IsDBClosed(err) {
		// No call on a closed *sql.DB can pass: no outage to ride out.
		// Run returns (outageOver), woken if idle.
		e := fmt.Errorf("%s: %w", what, sqldb.WrapDBClosed(err))
		if r.dbClosed.CompareAndSwap(nil, &e) && !r.stopping.Load() {
			r.log.Error("outbox relay: the *sql.DB was closed; Run returns", "op", what, "table", r.o.table, "owner", r.cfg.owner, "err", err)
			select {
			case r.wake <- struct{}{}:
			default:
			}
		}
		r.health.kinds[sqldb.KindOther].Add(1)
		r.health.total.Add(1)
		r.st.dbErrors.Add(1)
		return
	}
	if errors.Is(err, context.Canceled) && (r.stopping.Load() || r.closed()) {
		// The relay cancelled its own call: it is shutting down.
		return
	}
	if !r.stopping.Load() && r.runCtx != nil && r.runCtx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		// Run's context ended (its deadline, or its caller cancelled it)
		// during one of the poll loop's calls (on contexts of Run's): the
		// relay is stopping. A call's own bound (callTimeout) ending
		// while Run's context is live is a failure, and so is one of
		// Run's last calls (stopping: marks and releases on contexts of
		// their own, bounded by callTimeout).
		return
	}
	h := &r.health
	k := sqldb.Classify(err)
	h.kinds[k].Add(1)
	h.total.Add(1)
	r.st.dbErrors.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tries++
	h.lastOp, h.lastErr = what, err
	if h.bad == nil {
		h.bad = map[string]bool{}
	}
	h.bad[opGroup(what)] = true
	if !h.failing {
		h.failing, h.since, h.tries, h.next = true, time.Now(), 1, stillFailingFirst
		r.log.Warn("outbox relay: database failing; retrying", "op", what, "kind", k.String(), "table", r.o.table, "owner", r.cfg.owner, "err", err)
		return
	}
	if h.tries >= h.next {
		h.next *= 10
		r.log.Warn("outbox relay: database still failing", "tries", h.tries, "for", time.Since(h.since).Round(time.Millisecond), "op", what, "kind", k.String(), "table", r.o.table, "owner", r.cfg.owner, "err", err)
	}
}

// The groups of database calls, each retried on its own goroutine or
// schedule: a failed call of a group is followed by a successful one of the
// same group before the relay reports the database recovered, so that a
// poll succeeding while the marks still fail (reads pass, writes do not) is
// no recovery.
const (
	groupPoll   = "poll" // claims, fetches, releases, the schema check, dead marks, cleanup
	groupRenew  = "renew"
	groupMark   = "mark"
	groupListen = "listen"
)

func opGroup(what string) string {
	switch what {
	case opRenew:
		return groupRenew
	case opMark:
		return groupMark
	case opListen:
		return groupListen
	}
	return groupPoll
}

// The ops of the groups other than groupPoll, as dbError is given them.
const (
	opRenew  = "renew leases"
	opMark   = "mark rows sent"
	opListen = "listen"
)

// dbOK records that the calls of group succeed again (for groupPoll: a
// poll whose calls all succeeded, with no failure meanwhile); once every
// group that failed has, the database has recovered: one log line.
func (r *Relay) dbOK(group string) {
	h := &r.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.failing {
		return
	}
	delete(h.bad, group)
	if len(h.bad) > 0 {
		return
	}
	r.log.Info("outbox relay: database recovered", "failed_tries", h.tries, "outage", time.Since(h.since).Round(time.Millisecond), "table", r.o.table, "owner", r.cfg.owner)
	h.failing = false
	h.tries, h.lastOp, h.lastErr = 0, "", nil
}

// outage returns how long the database calls have been failing with no
// successful poll (0 when not failing), with the failed calls and the last
// error.
func (r *Relay) outage() (d time.Duration, tries int, op string, err error) {
	h := &r.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.failing {
		return 0, 0, "", nil
	}
	return time.Since(h.since), h.tries, h.lastOp, h.lastErr
}

func (h *health) counts() DBErrorCounts {
	return DBErrorCounts{
		Connection: h.kinds[sqldb.KindConnection].Load(),
		Timeout:    h.kinds[sqldb.KindTimeout].Load(),
		Conflict:   h.kinds[sqldb.KindConflict].Load(),
		Schema:     h.kinds[sqldb.KindSchema].Load(),
		Storage:    h.kinds[sqldb.KindStorage].Load(),
		Other:      h.kinds[sqldb.KindOther].Load(),
	}
}

// lastDBError returns the last failed database call's error while the
// database is failing, or "no database error".
func (r *Relay) lastDBError() error {
	if _, _, op, err := r.outage(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return errors.New("no answer")
}

// outageOver returns an error wrapping ErrDatabaseUnavailable once the
// database has been failing for WithMaxOutage.
//
// It returns an error wrapping ErrDBClosed at once when a call failed on a
// closed *sql.DB.
func (r *Relay) outageOver() error {
	if e := r.dbClosed.Load(); e != nil {
		return fmt.Errorf("outbox: relay: %w", *e)
	}
	if r.cfg.maxOutage <= 0 {
		return nil
	}
	d, tries, op, err := r.outage()
	if d < r.cfg.maxOutage {
		return nil
	}
	r.log.Error("outbox relay: database away longer than WithMaxOutage; Run returns", "for", d.Round(time.Millisecond), "tries", tries, "table", r.o.table, "owner", r.cfg.owner, "err", err)
	return fmt.Errorf("%w: every poll failed for %v (%d failed calls; max outage %v); last: %s: %w", ErrDatabaseUnavailable, d.Round(time.Millisecond), tries, r.cfg.maxOutage, op, err)
}

// callTimeout bounds each of the relay's database operations (a claim, a
// fetch, a renewal, a mark): a third of the lease, at least 5 s. A call
// that hangs (a server that stopped answering, a network partition) fails
// then, rather than holding the relay until TCP gives up.
func (r *Relay) callTimeout() time.Duration { return max(r.cfg.lease/3, 5*time.Second) }

func (r *Relay) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.callTimeout())
}
