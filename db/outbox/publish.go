package outbox

import (
	"context"
	"time"
)

type job struct {
	e    Event
	t    *tenure
	note noteSlot // the row's SetMarkNote (its last call's)
}

type jobKey struct{}

func (r *Relay) submit(t *tenure, e Event) {
	j := &job{e: e, t: t}
	r.mu.Lock()
	r.inflight++
	t.inflight++
	t.fetched = true
	r.mu.Unlock()
	t.after = e.Seq
	if t.firstRow == 0 {
		t.firstRow = max(r.mono(), 1)
	}
	jctx := context.WithValue(context.Background(), jobKey{}, j)
	if _, err := r.sched.TrySubmit(jctx, e.Key, func(ctx context.Context) error { return r.runJob(ctx, j) }); err != nil {
		// Cannot happen while the bounds match the batch; give the row
		// back and start the key afresh rather than lose it.
		r.log.Error("outbox relay: scheduler refused a row", "err", err)
		r.abandon(j)
	}
}

func (r *Relay) runJob(ctx context.Context, j *job) error {
	r.beginTask()
	defer r.endTask()
	t := j.t
	if r.stopping.Load() {
		r.abandon(j)
		return nil
	}
	dl := t.deadline.Load()
	if now := r.mono(); now >= dl {
		// Every row of the tenure that comes here after its lease ended
		// is counted, not only the first (which marks the tenure lost).
		if !t.lost.Swap(true) {
			r.st.leasesLost.Add(1)
		}
		r.st.lapsedBeforeSink.Add(1)
		if r.lapseWarn.allow(now, leaseWarnEvery) {
			r.log.Warn("outbox relay: a key's lease ended before its row was published (the row is left for the key's next claim): its renewals failed (see the database's errors), or, if this repeats while the database answers, the lease is short for this database or machine: raise WithLeaseDuration",
				"table", r.o.table, "key", t.key, "seq", j.e.Seq, "lease", r.cfg.lease)
		}
		r.abandon(j)
		return nil
	}
	if t.lost.Load() {
		r.abandon(j)
		return nil
	}
	sctx, cancel := context.WithDeadline(ctx, r.clock0.Add(time.Duration(dl)))
	defer cancel()
	sctx = context.WithValue(sctx, claimKey{}, Claim{Key: t.key, Owner: r.cfg.owner, Token: r.token, Epoch: t.epoch})
	j.note.v.Store(nil) // an earlier attempt's note is not this call's
	sctx = context.WithValue(sctx, noteKey{}, &j.note)
	unhook := context.AfterFunc(t.fenced, cancel) // the lease was taken: stop the call
	defer unhook()
	returned := false
	defer func() {
		if !returned { // the sink panicked (or called runtime.Goexit): a failed call
			r.st.sinkErrors.Add(1)
		}
	}()
	err := r.sink(sctx, j.e)
	returned = true
	unhook()
	cancel()
	if err == nil {
		r.st.published.Add(1)
		if r.noMark {
			return nil
		}
		r.fmu.Lock()
		r.toMark = append(r.toMark, j)
		r.fmu.Unlock()
		select {
		case r.flushSig <- struct{}{}:
		default:
		}
		return nil
	}
	r.st.sinkErrors.Add(1)
	if t.lost.Load() || r.mono() >= t.deadline.Load() || (r.stopping.Load() && ctx.Err() != nil) {
		// The lease ended or the relay is stopping: not the row's failure.
		t.lost.Store(true)
		r.abandon(j)
		return nil
	}
	return err
}

func (r *Relay) abandon(j *job) {
	r.st.abandoned.Add(1)
	j.t.lost.Store(true)
	r.settle(j)
}

func (r *Relay) settle(j *job) {
	r.mu.Lock()
	r.inflight--
	j.t.inflight--
	r.settled++
	// Refill once half a batch has settled (or the relay is half
	// empty): a poll per settled row would read the held keys over and
	// over for one row each. Counting settled rows, not free slots, keeps
	// the refill rate when a failing key holds some slots for long.
	refill := r.settled >= r.cfg.batch/2 || r.inflight <= r.cfg.batch/2
	r.mu.Unlock()
	if refill {
		r.signal()
	}
}
