package outbox

import (
	"context"

	"github.com/keysched/keysched/db/sqldb"
)

// On PostgreSQL, with the NOTIFY trigger and a LISTEN, a relay tells writers
// when it is idle: a row of its token in <table>_idle, live until a lease
// from when it was written. The trigger notifies only while such a row is
// live, so a busy relay (it polls) costs the writers' commits nothing: a
// notifying commit takes PostgreSQL's server-wide notify lock (see
// notifyTrigger).
//
// The relay writes the row when a poll had room and found no row to fetch,
// and no poll found rows in the last idleConfirm (25 ms; a steady stream
// seen between two of its rows is not idleness: the relay looks again
// then), then polls once more before it sleeps: a write committed before the row
// was is found by that poll. A write whose transaction's first inserting
// statement ran before the row was committed (the trigger checks the idle
// table once per transaction, there: it saw no idle relay, so the
// transaction notifies nobody) and that commits after that second poll
// began is found by the next poll,
// WithPollInterval later at most: that is the price of the check, one poll
// interval for a write racing the relay's going idle. The relay deletes the
// row when a fetch finds rows (before it publishes them), when its LISTEN
// connection is down, and when Run returns; while idle it writes the row
// again every third of a lease. A relay that dies leaves its row until it
// expires: writers notify nobody in particular meanwhile.

// goIdle writes the relay's idle row when it is due (not written yet, or a
// third of a lease old) and the relay listens. It reports whether it wrote
// the row just now for the first time since the relay was busy: the caller
// then polls once more before it sleeps. Loop goroutine only.
func (r *Relay) goIdle(ctx context.Context) (first bool) {
	if r.o.dialect != Postgres || !r.o.notify || !r.cfg.listen {
		return false
	}
	if r.noIdle && r.mono()-r.noIdleAt < int64(r.cfg.lease/3) {
		// No idle table at the last try: look again every third of a
		// lease, so that once CreateSchema has upgraded the schema (its
		// trigger then notifies only idle relays) this relay is woken
		// again without a restart.
		return false
	}
	if !r.st.listening.Load() {
		// No LISTEN (being re-established): a notification would be lost.
		r.goBusy(ctx)
		return false
	}
	now := r.mono()
	was := r.idleRow.Load()
	if was && now-r.idleAt < int64(r.cfg.lease/3) {
		return false
	}
	cctx, cancel := r.callCtx(ctx)
	defer cancel()
	if _, err := r.o.db.ExecContext(cctx, r.o.q.idle, r.token, r.cfg.lease.Microseconds()); err != nil {
		if sqldb.Classify(err) == sqldb.KindSchema {
			// A schema of an older version: its trigger notifies every
			// write, so the relay is woken anyway.
			r.noIdleAt = r.mono()
			if r.noIdle {
				return false
			}
			r.noIdle = true
			r.log.Warn("outbox relay: no idle table (a schema of an older version: run CreateSchema); writers notify on every commit", "table", r.o.table, "err", err)
			return false
		}
		r.dbError("mark the relay idle", err)
		return false
	}
	r.okCalls.Add(1)
	if r.noIdle {
		r.noIdle = false
		r.log.Info("outbox relay: idle table found (schema upgraded): writers notify this relay while it is idle", "table", r.o.table)
	}
	r.idleAt = now
	r.idleRow.Store(true)
	return !was
}

// goBusy deletes the relay's idle row if it has one. On failure the row
// stays until it expires (writers notify meanwhile). Loop goroutine, or Run
// after the loop.
func (r *Relay) goBusy(ctx context.Context) {
	if !r.idleRow.Swap(false) {
		return
	}
	cctx, cancel := r.callCtx(ctx)
	defer cancel()
	if _, err := r.o.db.ExecContext(cctx, r.o.q.busy, r.token); err != nil {
		r.dbError("mark the relay busy", err)
		return
	}
	r.okCalls.Add(1)
}
