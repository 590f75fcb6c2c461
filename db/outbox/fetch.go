package outbox

import (
	"context"
	"database/sql"

	"github.com/keysched/keysched"
)

// fetch reads up to room pending rows of the held keys, beyond what each
// tenure already submitted, and submits them in order. It returns how many
// it submitted.
func (r *Relay) fetch(ctx context.Context, room int) int {
	type want struct {
		t     *tenure
		limit int
		after int64 // fetch the key's pending rows beyond this seq
	}
	var wants []want
	now := r.mono()
	r.mu.Lock()
	for _, t := range r.keys {
		t.fetched = t.inflight > 0
		if t.firstRow != 0 && now-t.firstRow > int64(r.cfg.lease) {
			t.draining = true
		}
		if t.lost.Load() || t.draining {
			continue
		}
		if l := r.cfg.keyBatch - t.inflight; l > 0 {
			// With nothing of the key in flight, every row the tenure
			// submitted is settled (marked, or dead: not pending), so
			// the key is read from its oldest pending row, as a fresh
			// claim would: a row that is pending below the cursor (one
			// committed after a later row of its key, one recovered or
			// resumed) goes out at this fetch, not once the key's linger
			// has ended (up to ten poll intervals, plus a poll).
			after := t.after
			if t.inflight == 0 {
				after = 0
			}
			wants = append(wants, want{t, l, after})
		}
	}
	r.mu.Unlock()
	if len(wants) == 0 {
		return 0
	}
	ctx, cancel := r.callCtx(ctx)
	defer cancel()
	var evs []Event
	var err error
	fetchQ := r.o.q.fetch
	if r.cfg.policy == keysched.Park {
		fetchQ = r.o.q.fetchPark
	}
	if r.o.dialect == Postgres {
		keys := make([]string, len(wants))
		afters := make([]int64, len(wants))
		epochs := make([]int64, len(wants))
		for i, w := range wants {
			keys[i], afters[i], epochs[i] = w.t.key, w.after, w.t.epoch
		}
		evs, err = r.scanEvents(r.o.db.QueryContext(ctx, fetchQ, keys, afters, r.cfg.keyBatch, room, epochs, r.cfg.owner, r.token))
	} else {
		left := room
		for _, w := range wants {
			if left == 0 {
				break
			}
			var rows *sql.Rows
			var e error
			args := []any{w.t.key, w.after, r.cfg.owner, r.token, w.t.epoch, min(w.limit, left)}
			if r.fetchStmt != nil {
				rows, e = r.fetchStmt.QueryContext(ctx, args...)
			} else {
				rows, e = r.o.db.QueryContext(ctx, fetchQ, args...)
			}
			more, e := r.scanEvents(rows, e)
			if e != nil {
				err = e
				break
			}
			evs = append(evs, more...)
			left -= len(more)
		}
	}
	if err != nil {
		r.dbError("fetch rows", err)
		// Rows read before the error are still submitted below: each key's
		// rows are complete up to where they stop.
	} else {
		r.okCalls.Add(1)
	}
	if len(evs) > 0 {
		// Busy: writers stop notifying this relay before it publishes
		// (it polls until it finds nothing again).
		r.goBusy(ctx)
	}
	quota := make(map[*tenure]int, len(wants))
	for _, w := range wants {
		quota[w.t] = w.limit
	}
	stopped := map[*tenure]bool{}
	n := 0
	r.mu.Lock()
	byKey := make(map[string]*tenure, len(wants))
	for _, w := range wants {
		byKey[w.t.key] = w.t
	}
	r.mu.Unlock()
	for _, e := range evs {
		t := byKey[e.Key]
		if t == nil || stopped[t] || quota[t] == 0 || n == room {
			// Never submit a later row of a key whose earlier row was
			// left out: the cursor would pass over it.
			if t != nil {
				stopped[t] = true
			}
			continue
		}
		quota[t]--
		r.submit(t, e)
		n++
	}
	return n
}

func (r *Relay) scanEvents(rows *sql.Rows, err error) ([]Event, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var evs []Event
	for rows.Next() {
		var e Event
		var headers sql.NullString
		var attempts int
		created := r.o.q.timeDest()
		if err := rows.Scan(&e.Seq, &e.ID, &e.Key, &e.Type, &e.Payload, &headers, created, &attempts); err != nil {
			return evs, err
		}
		e.CreatedAt = r.o.q.timeOf(created)
		if e.Headers, err = decodeHeaders(headers); err != nil {
			return evs, err
		}
		evs = append(evs, e)
	}
	return evs, rows.Err()
}
