package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// A system is one way of doing the outbox's job: an event written in the
// application's transaction is delivered to the sink after the commit. Each
// value is fresh (its own tables) and used for one run.
type system interface {
	// writeTx writes the events idx in one transaction and commits it.
	writeTx(ctx context.Context, idx []int) error
	// start starts n consumers (relays, River clients, forwarders) that
	// call deliver for each event they take; a non-nil error from deliver
	// is the sink's failure (the system retries as it does).
	start(ctx context.Context, n int, deliver func(ctx context.Context, i int) error) (stop func(context.Context) error, err error)
	// close drops the run's tables and closes its connections.
	close()
	// tables is a LIKE pattern on schemaname.relname matching the run's
	// tables (--pgstats).
	tables() string
}

// workload: events 0..events-1; event i has key i%keys and is that key's
// (i/keys)-th event. With failing, key 0 is "bad": its sink calls fail for
// the whole run.
type workload struct {
	events, keys, perTx int
	writers             int  // concurrent writing goroutines (the application's requests)
	backlog             bool // write every event before the consumers start
	failing             bool
	timeout             time.Duration
}

func keyName(k int) string { return fmt.Sprintf("key-%04d", k) }

var errDown = errors.New("endpoint down")

// recorder is the sink shared by all systems: it records each event's commit
// and first delivery (in ns since the run's start), duplicates and per-key
// order violations (a first delivery of a key's event after a later event of
// that key was delivered).
type recorder struct {
	wl       workload
	start    time.Time
	commit   []atomic.Int64
	deliv    []atomic.Int64
	dups     atomic.Int64
	badCalls atomic.Int64
	mu       sync.Mutex
	maxSeq   []int
	viol     int64
	left     atomic.Int64
	awaited  int64
	done     chan struct{}
}

func newRecorder(wl workload) *recorder {
	r := &recorder{wl: wl, commit: make([]atomic.Int64, wl.events), deliv: make([]atomic.Int64, wl.events),
		maxSeq: make([]int, wl.keys), done: make(chan struct{})}
	for k := range r.maxSeq {
		r.maxSeq[k] = -1
	}
	wait := wl.events
	if wl.failing {
		wait -= (wl.events + wl.keys - 1) / wl.keys // key 0's events
	}
	r.left.Store(int64(wait))
	r.awaited = int64(wait)
	return r
}

func (r *recorder) now() int64 { return int64(time.Since(r.start)) + 1 }

func (r *recorder) deliver(_ context.Context, i int) error {
	if i < 0 || i >= r.wl.events {
		return fmt.Errorf("event %d out of range", i)
	}
	k := i % r.wl.keys
	if r.wl.failing && k == 0 {
		r.badCalls.Add(1)
		return errDown
	}
	if !r.deliv[i].CompareAndSwap(0, r.now()) {
		r.dups.Add(1)
		return nil
	}
	seq := i / r.wl.keys
	r.mu.Lock()
	if seq < r.maxSeq[k] {
		r.viol++
	} else {
		r.maxSeq[k] = seq
	}
	r.mu.Unlock()
	if r.left.Add(-1) == 0 {
		close(r.done)
	}
	return nil
}

type result struct {
	DB        string `json:"db"`
	System    string `json:"system"`
	Consumers int    `json:"consumers"`
	Scenario  string `json:"scenario"` // "healthy" or "one key failing"
	Round     int    `json:"round"`
	Events    int    `json:"events"`
	Keys      int    `json:"keys"`
	PerTx     int    `json:"per_tx"`
	// WriteRate: events committed per second by the writer, while the
	// consumers run.
	WriteRate float64 `json:"write_events_per_s"`
	// DeliverRate: events first delivered per second, from the run's start
	// to the last delivery awaited (all events; the other keys' when one
	// fails).
	DeliverRate float64 `json:"delivered_events_per_s"`
	// OtherRate: the same over the events of keys other than key 0 (the
	// failing one in a failing run).
	OtherRate       float64  `json:"other_keys_events_per_s"`
	P50ms           float64  `json:"commit_to_delivery_p50_ms"`
	P99ms           float64  `json:"commit_to_delivery_p99_ms"`
	Delivered       int      `json:"delivered"` // first deliveries
	Awaited         int      `json:"awaited"`   // the events the run waits for: all, or the other keys' when key 0 fails
	OrderViolations int64    `json:"order_violations"`
	Duplicates      int64    `json:"duplicates"`
	BadCalls        int64    `json:"failing_key_sink_calls"`
	TimedOut        bool     `json:"timed_out"`
	Load1           float64  `json:"load_avg_1m"`
	PG              *pgDelta `json:"pgstats,omitempty"` // --pgstats
}

// run writes the workload in transactions of perTx events while n consumers
// deliver it, until every awaited event was delivered or wl.timeout passed.
func run(ctx context.Context, sys system, wl workload, n int) (result, error) {
	rec := newRecorder(wl)
	rec.start = time.Now()
	var wdur time.Duration
	werr := make(chan error, 1)
	if wl.backlog {
		if err := rec.writeAll(ctx, sys); err != nil {
			return result{}, err
		}
		wdur = time.Since(rec.start)
		werr <- nil
	}
	stop, err := sys.start(ctx, n, rec.deliver)
	if err != nil {
		return result{}, err
	}
	from := int64(0) // the delivery rates' start: the writers' or, with a backlog, the consumers'
	if wl.backlog {
		from = rec.now()
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !wl.backlog {
		go func() {
			err := rec.writeAll(wctx, sys)
			wdur = time.Since(rec.start)
			werr <- err
		}()
	}
	timer := time.NewTimer(wl.timeout)
	defer timer.Stop()
	timedOut, written := false, wl.backlog
	select {
	case <-rec.done:
	case <-timer.C:
		timedOut = true
	case err := <-werr:
		written = true
		if err != nil {
			_ = stop(ctx)
			return result{}, err
		}
		select {
		case <-rec.done:
		case <-timer.C:
			timedOut = true
		}
	}
	end := rec.now()
	if !written {
		// Delivered before the writer returned (the last commit's
		// bookkeeping) or timed out: let the writer finish or cancel it.
		if timedOut {
			cancel()
		}
		if err := <-werr; err != nil && !timedOut {
			_ = stop(ctx)
			return result{}, err
		}
	}
	cancel()
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	if err := stop(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return result{}, fmt.Errorf("stop: %w", err)
	}
	res := result{Awaited: int(rec.awaited), Events: wl.events, Keys: wl.keys, PerTx: wl.perTx, Consumers: n, TimedOut: timedOut,
		Duplicates: rec.dups.Load(), BadCalls: rec.badCalls.Load(), Scenario: "healthy"}
	if wl.failing {
		res.Scenario = "one key failing"
	}
	if wdur > 0 {
		res.WriteRate = float64(wl.events) / wdur.Seconds()
	}
	var lat []float64
	var lastAll, lastOther int64
	others := 0
	for i := range rec.deliv {
		d := rec.deliv[i].Load()
		if d == 0 {
			continue
		}
		res.Delivered++
		lastAll = max(lastAll, d)
		if i%wl.keys != 0 {
			lastOther = max(lastOther, d)
			others++
		}
		lat = append(lat, float64(max(0, d-rec.commit[i].Load()))/1e6)
	}
	if timedOut {
		lastAll, lastOther = end, end
	}
	if lastAll > from {
		res.DeliverRate = float64(res.Delivered) / (time.Duration(lastAll - from).Seconds())
	}
	if lastOther > from {
		res.OtherRate = float64(others) / (time.Duration(lastOther - from).Seconds())
	}
	res.P50ms, res.P99ms = quantile(lat, 0.50), quantile(lat, 0.99)
	rec.mu.Lock()
	res.OrderViolations = rec.viol
	rec.mu.Unlock()
	return res, nil
}

// writeAll writes the workload: writer w writes the events of keys k with
// k mod writers == w, in event order, so a key's events are committed in
// its order.
func (r *recorder) writeAll(ctx context.Context, sys system) error {
	wl := r.wl
	errs := make(chan error, wl.writers)
	for w := range wl.writers {
		go func() {
			idx := make([]int, 0, wl.perTx)
			for i := 0; i < wl.events; i++ {
				if i%wl.keys%wl.writers != w {
					continue
				}
				idx = append(idx, i)
				if len(idx) == wl.perTx {
					if err := r.commitTx(ctx, sys, idx); err != nil {
						errs <- err
						return
					}
					idx = idx[:0]
				}
			}
			errs <- r.commitTx(ctx, sys, idx)
		}()
	}
	var all []error
	for range wl.writers {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// commitTx writes and commits the events idx (none: nothing) and records
// their commit time.
func (r *recorder) commitTx(ctx context.Context, sys system, idx []int) error {
	if len(idx) == 0 {
		return nil
	}
	if err := sys.writeTx(ctx, idx); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	t := r.now()
	for _, j := range idx {
		r.commit[j].Store(t)
	}
	return nil
}

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return xs[min(len(xs)-1, int(q*float64(len(xs))))]
}
