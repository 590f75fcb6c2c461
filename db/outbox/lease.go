package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/keysched/keysched"
)

// A tenure is one holding of one key's lease by this relay. Tasks of a tenure
// that is lost (lease gone, key parked, a row given back) publish nothing;
// the key is then released and later claimed afresh from its oldest pending
// row.
type tenure struct {
	key      string
	epoch    int64        // the claim's epoch in the lease row
	deadline atomic.Int64 // r.mono() nanoseconds at which the lease ends locally
	lost     atomic.Bool
	// fenced ends when the database shows the lease taken by another
	// token (a renewal or a mark found it gone): the sink call in flight
	// on the key is cancelled.
	fenced context.Context
	cancel context.CancelFunc
	after  int64 // highest seq submitted in this tenure (loop goroutine)
	// firstRow: r.mono() when the tenure submitted its first row (0:
	// none yet; loop goroutine). Draining counts from it, not from the
	// claim: a tenure that has submitted nothing has no cursor for a
	// late row to wait behind, and one whose first fetch came later than
	// a lease after its claim (a slow database, a loaded machine) would
	// otherwise be released before publishing anything, claimed again
	// and released again, for ever.
	firstRow int64
	inflight int  // rows of this tenure not settled (r.mu)
	fetched  bool // rows fetched in the current poll (r.mu)
	// drainedAt: r.mono() when a poll first found the key drained
	// (nothing in flight and nothing fetched), 0 while it is not (r.mu).
	// A drained key lingers: its lease is kept (and renewed) and it is
	// fetched at every poll, so that a key whose next row comes soon is
	// not released and claimed again (a commit each) for every burst. It
	// is released once it has stayed drained for the linger (cfg.linger),
	// or at once when the relay has no room to fetch (a full batch) or
	// needs its slot for a key waiting (WithMaxKeys): a relay never holds
	// a key it cannot serve.
	drainedAt int64
	// draining: the tenure has been fetching for longer than a lease
	// (since firstRow); it fetches nothing more
	// and is released once its rows settle, so that the key is claimed
	// afresh from its oldest pending row (r.mu). That bounds how long a
	// row committed late with a lower seq than rows already fetched (two
	// PostgreSQL transactions on one key committing out of insert order)
	// waits behind the cursor.
	draining bool
}

func newTenure(key string, epoch, deadline int64) *tenure {
	t := &tenure{key: key, epoch: epoch}
	t.deadline.Store(deadline)
	t.fenced, t.cancel = context.WithCancel(context.Background())
	return t
}

// fence marks the tenure lost because its lease is no longer this relay's in
// the database, and cancels the key's sink call in flight. It reports
// whether the tenure was not lost before.
func (t *tenure) fence() bool {
	first := !t.lost.Swap(true)
	t.cancel()
	return first
}

// acquire claims up to room keys that have pending rows and no live lease.
func (r *Relay) acquire(ctx context.Context, room int) {
	ctx, cancel := r.callCtx(ctx)
	defer cancel()
	q := r.o.q.candidates
	if r.cfg.policy == keysched.Park {
		q = r.o.q.candidatesPark
	}
	// Visit at most this many keys per poll; the cursor moves on, and
	// wraps around at the last key, so every key gets its turn.
	walk := 4*room + 64
	args := []any{r.cursor, walk}
	// A lease of this relay's token with no tenure (its release failed) is
	// free to it: it has nothing of the key in flight. A live lease of any
	// other token is not, whatever its owner name.
	args = append(args, r.cfg.owner, r.token)
	rows, err := r.o.db.QueryContext(ctx, q, args...)
	if err != nil {
		r.dbError("find keys", err)
		return
	}
	var found []string
	visited, last := 0, ""
	for rows.Next() {
		var k string
		var free bool
		if err := rows.Scan(&k, &free); err != nil {
			rows.Close()
			r.dbError("find keys", err)
			return
		}
		visited++
		last = k
		if free {
			found = append(found, k)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		r.dbError("find keys", err)
		return
	}
	r.okCalls.Add(1)
	if r.afterWalk != nil {
		r.afterWalk(found)
	}
	if visited < walk {
		r.cursor = "" // reached the last key: start over next time
	} else {
		r.cursor = last
	}
	var cands []string
	seen := map[string]bool{}
	r.mu.Lock()
	// A held key the walk found with pending rows is served by this
	// poll's fetch: it does not give its slot away.
	for _, k := range found {
		seen[k] = true
	}
	lingering := r.lingering(seen)
	// A key claimed without a slot to fill would only be released again.
	// A lingering key (drained, nothing in flight) gives its slot to a key
	// that waits: the relay never holds keys it cannot serve while others
	// wait for them.
	free := r.cfg.maxKeys - len(r.keys)
	limit := min(free+len(lingering), room)
	clear(seen)
	for _, k := range found {
		if !seen[k] && r.keys[k] == nil && len(cands) < limit {
			seen[k] = true
			cands = append(cands, k)
		}
	}
	var evicted []claimed
	if n := len(cands) - max(free, 0); n > 0 {
		// The keys drained longest first.
		sort.Slice(lingering, func(i, j int) bool { return lingering[i].drainedAt < lingering[j].drainedAt })
		for _, t := range lingering[:n] {
			t.cancel()
			delete(r.keys, t.key)
			evicted = append(evicted, claimed{t.key, t.epoch})
		}
		r.st.keysHeld.Store(int64(len(r.keys)))
	}
	r.mu.Unlock()
	if len(evicted) > 0 {
		r.release(ctx, evicted)
	}
	if len(cands) == 0 {
		return
	}
	sort.Strings(cands) // one lock order for every relay
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	// The tenures' local deadline runs from here, before the claim is
	// sent: the database computes the expiry when the claim runs, after
	// any wait for a lock (see sqliteNow), so the local deadline ends no
	// later than the expiry written.
	start := r.mono()
	got := map[string]int64{} // key -> the claim's epoch
	if r.o.dialect == Postgres {
		micros := r.cfg.lease.Microseconds()
		ins, err := r.queryClaims(ctx, r.o.db, r.o.q.acquireInsert, cands, r.cfg.owner, micros, r.token)
		if err != nil {
			r.dbError("claim keys", err)
			return
		}
		var rest []string
		for _, k := range cands {
			if e, ok := ins[k]; ok {
				got[k] = e
			} else {
				rest = append(rest, k)
			}
		}
		if len(rest) > 0 {
			taken, err := r.queryClaims(ctx, r.o.db, r.o.q.acquireTakeover, rest, r.cfg.owner, micros, r.token)
			if err != nil {
				r.dbError("take over expired keys", err)
			}
			for k, e := range taken {
				got[k] = e
			}
		}
	} else {
		for len(cands) > 0 {
			n := min(len(cands), 150)
			args := make([]any, 1, 4*n+1)
			args[0] = r.cfg.lease.Microseconds()
			var b strings.Builder
			for i, k := range cands[:n] {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString("(?, ?, ?, ?)")
				args = append(args, k, r.cfg.owner, r.token, i+1)
			}
			ks, err := r.queryClaims(ctx, r.o.db, fmt.Sprintf(r.o.q.acquireUpsert, b.String()), args...)
			if err != nil {
				r.dbError("claim keys", err)
				break
			}
			for k, e := range ks {
				got[k] = e
			}
			cands = cands[n:]
		}
	}
	r.mu.Lock()
	for k, e := range got {
		r.keys[k] = newTenure(k, e, start+int64(r.cfg.lease))
	}
	r.st.keysHeld.Store(int64(len(r.keys)))
	r.mu.Unlock()
	r.checkClaimTime(time.Duration(r.mono()-start), len(got))
}

// leaseWarnEvery is how often at most a relay logs each of its warnings
// that the lease is short for its database (see checkClaimTime).
const leaseWarnEvery = time.Minute

// checkClaimTime warns when a claim of n keys took a third of the lease or
// more. A tenure's lease runs, locally, from when its claim was sent (in the
// database from when the claim ran, after any lock wait), and the relay
// still has to fetch the key's rows, call the sink and mark them within it
// (renewing every third of it): with a database that far away, or that
// slow, leases end before their rows are published, the rows are left
// for the next claim, and a relay whose round trips take longer than the
// lease publishes nothing at all.
func (r *Relay) checkClaimTime(took time.Duration, n int) {
	if n == 0 || took*3 < r.cfg.lease {
		return
	}
	r.st.slowClaims.Add(1)
	if r.leaseWarn.allow(r.mono(), leaseWarnEvery) {
		r.log.Warn("outbox relay: claiming keys took a third of the lease or more: leases may end before their rows are published; raise WithLeaseDuration well above the database's round trips",
			"table", r.o.table, "took", took, "lease", r.cfg.lease, "keys", n)
	}
}

// A rateLimit lets an event through at most once per interval.
type rateLimit struct{ last atomic.Int64 } // mono ns of the last let through; 0: none

// allow reports whether an event at now (mono ns) may pass, every apart.
func (l *rateLimit) allow(now int64, every time.Duration) bool {
	last := l.last.Load()
	if last != 0 && now-last < int64(every) {
		return false
	}
	return l.last.CompareAndSwap(last, max(now, 1))
}

// renewer renews the relay's leases every third of the lease duration, on
// its own goroutine so that a slow poll cannot make them lapse.
func (r *Relay) renewer(ctx context.Context, stop <-chan struct{}) {
	tick := time.NewTicker(r.cfg.lease / 3)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			r.renew(ctx)
		}
	}
}

func (r *Relay) renew(ctx context.Context) {
	ctx, cancel := r.callCtx(ctx)
	defer cancel()
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	// Only the keys held: a lease row of this token without a tenure (its
	// release failed, or a claim's answer was lost) is left to expire, so
	// that other relays can take its key.
	r.mu.Lock()
	held := make([]claimed, 0, len(r.keys))
	for k, t := range r.keys {
		held = append(held, claimed{k, t.epoch})
	}
	r.mu.Unlock()
	if len(held) == 0 {
		r.dbOK(groupRenew) // nothing to renew: nothing failing
		return
	}
	sortClaims(held) // one lock order for every relay
	// Before the renewal is sent: see acquire.
	start := r.mono()
	var keys map[string]int64
	var err error
	if r.o.dialect == Postgres {
		ks, es := splitClaims(held)
		keys, err = r.queryClaims(ctx, r.o.db, r.o.q.renew, r.cfg.owner, r.token, r.cfg.lease.Microseconds(), ks, es)
	} else {
		keys = map[string]int64{}
		err = r.inTx(ctx, func(tx *sql.Tx) error {
			for rest := held; len(rest) > 0; {
				n := min(len(rest), 400)
				args := make([]any, 0, 2*n+3)
				args = append(args, r.cfg.lease.Microseconds(), r.cfg.owner, r.token)
				for _, c := range rest[:n] {
					args = append(args, c.key, c.epoch)
				}
				ks, err := r.queryClaims(ctx, tx, r.o.q.renew+pairList(n)+" RETURNING key, epoch", args...)
				if err != nil {
					return err
				}
				for k, e := range ks {
					keys[k] = e
				}
				rest = rest[n:]
			}
			return nil
		})
	}
	if err != nil {
		r.dbError(opRenew, err)
		return
	}
	r.okCalls.Add(1)
	r.dbOK(groupRenew)
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, t := range r.keys {
		if e, ok := keys[k]; ok && e == t.epoch {
			t.deadline.Store(start + int64(r.cfg.lease))
		} else if t.fence() {
			r.st.leasesLost.Add(1)
			r.log.Warn("outbox relay: lease on key lost (expired and taken over, or taken by another relay); its sink call in flight is cancelled, its rows in flight are given back", "table", r.o.table, "owner", r.cfg.owner, "token", r.token, "epoch", t.epoch)
		}
	}
}

// A claimed is a claim of a key: the key and the claim's epoch.
type claimed struct {
	key   string
	epoch int64
}

func sortClaims(cs []claimed) {
	sort.Slice(cs, func(i, j int) bool { return cs[i].key < cs[j].key })
}

func splitClaims(cs []claimed) (keys []string, epochs []int64) {
	keys, epochs = make([]string, len(cs)), make([]int64, len(cs))
	for i, c := range cs {
		keys[i], epochs[i] = c.key, c.epoch
	}
	return keys, epochs
}

// queryClaims runs a statement returning (key, epoch) rows.
func (r *Relay) queryClaims(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, query string, args ...any) (map[string]int64, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	keys := map[string]int64{}
	for rows.Next() {
		var k string
		var e int64
		if err := rows.Scan(&k, &e); err != nil {
			return nil, err
		}
		keys[k] = e
	}
	return keys, rows.Err()
}

// lingering returns the tenures that linger (drained, nothing in flight, not
// lost nor draining) whose keys are not in busy. r.mu held.
func (r *Relay) lingering(busy map[string]bool) []*tenure {
	var ts []*tenure
	for k, t := range r.keys {
		if t.inflight == 0 && t.drainedAt != 0 && !t.lost.Load() && !t.draining && !busy[k] {
			ts = append(ts, t)
		}
	}
	return ts
}

// releaseEnded forgets tenures with nothing in flight that are lost,
// draining, or drained (found with nothing to fetch) for longer than the
// linger (at once when the relay has no room: full is true), and deletes
// their lease rows (those still ours). A drained key within its linger is
// kept: see tenure.drainedAt.
func (r *Relay) releaseEnded(ctx context.Context, full bool) {
	var ended []claimed
	now := r.mono()
	r.mu.Lock()
	for k, t := range r.keys {
		if t.inflight != 0 {
			t.drainedAt = 0
			continue
		}
		drained := !t.fetched
		if drained && t.drainedAt == 0 {
			t.drainedAt = max(now, 1)
		} else if !drained {
			t.drainedAt = 0
		}
		if t.lost.Load() || t.draining || (drained && (full || now-t.drainedAt >= int64(r.cfg.linger))) {
			t.cancel()
			delete(r.keys, k)
			ended = append(ended, claimed{k, t.epoch})
		}
	}
	r.st.keysHeld.Store(int64(len(r.keys)))
	r.mu.Unlock()
	r.release(ctx, ended)
}

// release deletes the lease rows of the claims given, if still this
// relay's (their tenures already forgotten). On failure the leases expire
// by themselves (the renewer no longer renews them): the keys are only
// delayed.
func (r *Relay) release(ctx context.Context, ended []claimed) {
	if len(ended) == 0 {
		return
	}
	ctx, cancel := r.callCtx(ctx)
	defer cancel()
	sortClaims(ended) // one lock order for every statement on lease rows
	var err error
	if r.o.dialect == Postgres {
		ks, es := splitClaims(ended)
		_, err = r.o.db.ExecContext(ctx, r.o.q.release, r.cfg.owner, r.token, ks, es)
	} else {
		for len(ended) > 0 && err == nil {
			n := min(len(ended), 400)
			args := []any{r.cfg.owner, r.token}
			for _, c := range ended[:n] {
				args = append(args, c.key, c.epoch)
			}
			_, err = r.o.db.ExecContext(ctx, r.o.q.release+pairList(n), args...)
			ended = ended[n:]
		}
	}
	if err != nil {
		r.dbError("release leases", err)
	}
}
