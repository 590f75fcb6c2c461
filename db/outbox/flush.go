package outbox

import (
	"context"
	"database/sql"
	"strings"
	"time"
)

func (r *Relay) flusher(ctx context.Context, stop <-chan struct{}) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-stop:
			return
		case <-r.flushSig:
		case <-retry.C:
		}
		if !r.flushAll(ctx) {
			retry.Reset(r.cfg.poll)
		}
	}
}

// flushAll marks every published row sent (or deletes it), in one statement
// per chunk, only on keys whose lease this relay still holds (its owner name
// and token). On failure the rows stay queued, in order, for the next try. A
// row the statement did not mark is on a key whose lease another relay took
// (or that relay already settled the row): the tenure is fenced and the row
// given back, pending, to the key's holder, which publishes it again.
func (r *Relay) flushAll(ctx context.Context) bool {
	r.fmu.Lock()
	batch := r.toMark
	r.toMark = nil
	r.fmu.Unlock()
	if len(batch) == 0 {
		r.dbOK(groupMark) // nothing to mark: nothing failing
		return true
	}
	ctx, cancel := r.callCtx(ctx)
	defer cancel()
	seqs := make([]int64, len(batch))
	keys := make([]string, len(batch))
	epochs := make([]int64, len(batch))
	for i, j := range batch {
		seqs[i], keys[i], epochs[i] = j.e.Seq, j.e.Key, j.t.epoch
	}
	marked := make(map[int64]bool, len(batch))
	collect := func(rows *sql.Rows, err error) error {
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s int64
			if err := rows.Scan(&s); err != nil {
				return err
			}
			marked[s] = true
		}
		return rows.Err()
	}
	// hooked gives the hook the rows the statements marked, in batch order.
	hooked := func(tx *sql.Tx) ([]func(), error) {
		if r.cfg.markHook == nil {
			return nil, nil
		}
		var ms []Marked
		for _, j := range batch {
			if marked[j.e.Seq] {
				ms = append(ms, Marked{Event: j.e, Claim: r.claim(j.t), State: Sent, Note: j.note.get()})
			}
		}
		return r.runHook(ctx, tx, ms)
	}
	var after []func()
	var err error
	switch {
	case r.o.dialect == Postgres && r.cfg.markHook == nil:
		// One statement, its own transaction.
		err = collect(r.o.db.QueryContext(ctx, r.markSentQuery(), seqs, keys, epochs, r.cfg.owner, r.token))
	case r.o.dialect == Postgres:
		err = r.inTx(ctx, func(tx *sql.Tx) error {
			if err := collect(tx.QueryContext(ctx, r.markSentQuery(), seqs, keys, epochs, r.cfg.owner, r.token)); err != nil {
				return err
			}
			var err error
			after, err = hooked(tx)
			return err
		})
	default:
		err = r.inTx(ctx, func(tx *sql.Tx) error {
			for rest := batch; len(rest) > 0; {
				n := min(len(rest), 400)
				args := make([]any, 0, 2*n+3)
				q := r.o.q.markSentDelete
				if r.cfg.retention > 0 {
					q = r.o.q.markSentUpdate
					args = append(args, time.Now().UnixMicro())
				}
				var b strings.Builder
				for i, j := range rest[:n] {
					if i > 0 {
						b.WriteString(", ")
					}
					b.WriteString("(?, ?)")
					args = append(args, j.e.Seq, j.t.epoch)
				}
				args = append(args, r.cfg.owner, r.token)
				if err := collect(tx.QueryContext(ctx, q+b.String()+r.o.q.markSentSuffix, args...)); err != nil {
					return err
				}
				rest = rest[n:]
			}
			var err error
			after, err = hooked(tx)
			return err
		})
	}
	if err != nil {
		r.dbError(opMark, err)
		r.fmu.Lock()
		r.toMark = append(batch, r.toMark...)
		r.fmu.Unlock()
		return false
	}
	r.okCalls.Add(1)
	r.dbOK(groupMark)
	r.st.marked.Add(uint64(len(marked)))
	r.runAfter(after)
	for _, j := range batch {
		if marked[j.e.Seq] {
			r.settle(j)
			continue
		}
		if j.t.fence() {
			r.st.leasesLost.Add(1)
			r.log.Warn("outbox relay: lease on key lost (taken by another relay) before its published rows were marked; they stay pending for the key's holder", "table", r.o.table, "owner", r.cfg.owner, "token", r.token, "epoch", j.t.epoch)
		}
		r.abandon(j)
	}
	return true
}

// markSentQuery is PostgreSQL's mark of published rows: delete them, or
// mark them sent with WithRetention.
func (r *Relay) markSentQuery() string {
	if r.cfg.retention > 0 {
		return r.o.q.markSentUpdate
	}
	return r.o.q.markSentDelete
}

// claim returns the claim t stands for.
func (r *Relay) claim(t *tenure) Claim {
	return Claim{Key: t.key, Owner: r.cfg.owner, Token: r.token, Epoch: t.epoch}
}

func (r *Relay) cleanup(ctx context.Context) {
	ctx, cancel := r.callCtx(ctx)
	defer cancel()
	r.lastClean = r.mono()
	var err error
	if r.o.dialect == Postgres {
		_, err = r.o.db.ExecContext(ctx, r.o.q.cleanup, r.cfg.retention.Microseconds(), 10000)
	} else {
		_, err = r.o.db.ExecContext(ctx, r.o.q.cleanup, time.Now().Add(-r.cfg.retention).UnixMicro(), 10000)
	}
	if err != nil {
		r.dbError("delete sent rows past retention", err)
	}
}
