package outbox

import (
	"context"
	"time"
)

// Crash makes the relay stop like a crashed process when Run's context
// ends: no final marking of published rows, no release of its leases.
// Call before Run.
func Crash(r *Relay) { r.crash = true }

// NoMark makes the relay never mark published rows sent: as if it crashed
// right after each publish. Call before Run.
func NoMark(r *Relay) { r.noMark = true }

// Renew renews the relay's leases now, as its renewer does every third of
// the lease duration.
func Renew(r *Relay) { r.renew(context.Background()) }

// Idle reports whether the relay's row in the idle table is live (it
// told writers to notify it).
func Idle(r *Relay) bool { return r.idleRow.Load() }

// DelayFetch makes each of the relay's polls wait d between claiming keys
// and fetching their rows, as a slow database or a starved process would.
// Call before Run.
func DelayFetch(r *Relay, d time.Duration) { r.beforeFetch = func() { time.Sleep(d) } }

// OnPoll makes the relay's loop call f after each poll with when the poll
// began (time since the relay was made) and whether it filled the batch
// (full) or found no row (idle). Call before Run.
func OnPoll(r *Relay, f func(began time.Duration, full, idle bool)) {
	r.afterPoll = func(began int64, full, idle bool) { f(time.Duration(began), full, idle) }
}

// OnWalk makes the relay call f with the free keys each claim walk found,
// before it claims them. Call before Run.
func OnWalk(r *Relay, f func(found []string)) { r.afterWalk = f }

// BeforeRecoverCommit makes each Recover batch of o call f just before its
// COMMIT (nil: nothing).
func BeforeRecoverCommit(o *Outbox, f func()) { o.beforeRecoverCommit = f }

// IdleConfirm is how long a relay must have found no row before it tells
// writers to notify it.
const IdleConfirm = idleConfirm
