package keysched

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/ants/v2"
)

// This file holds the workers: the ants pool (the scheduler's own, or one the
// caller shares), the ready queue of keys whose head task may run, and the
// runners that drain it.
//
// A runner is one function running on one pool worker: it pops a ready task,
// runs it and its key's successors (up to keyBudget), and repeats until the
// ready queue is empty. At most max runners exist at once. Only a party that
// reserves a runner slot ever calls the pool's Submit, so the scheduler never
// asks its own pool for more workers than it has, and a worker never blocks in
// Submit waiting for itself.

// readyQueue is a FIFO of runnable heads, linked through node.readyNext.
type readyQueue[K comparable] struct {
	_          padLine // a cache line of its own: submitters and workers both write it
	mu         sync.Mutex
	head, tail *node[K]
	n          atomic.Int64
	_          padLine
}

func (q *readyQueue[K]) push(n *node[K]) {
	q.mu.Lock()
	n.readyNext = nil
	if q.tail == nil {
		q.head = n
	} else {
		q.tail.readyNext = n
	}
	q.tail = n
	q.n.Add(1)
	q.mu.Unlock()
}

// pushList appends the n nodes linked from first to last by readyNext.
func (q *readyQueue[K]) pushList(first, last *node[K], n int) {
	q.mu.Lock()
	last.readyNext = nil
	if q.tail == nil {
		q.head = first
	} else {
		q.tail.readyNext = first
	}
	q.tail = last
	q.n.Add(int64(n))
	q.mu.Unlock()
}

func (q *readyQueue[K]) pop() *node[K] {
	if q.n.Load() == 0 {
		return nil
	}
	q.mu.Lock()
	n := q.head
	if n != nil {
		q.head = n.readyNext
		if q.head == nil {
			q.tail = nil
		}
		n.readyNext = nil
		q.n.Add(-1)
	}
	q.mu.Unlock()
	return n
}

func (q *readyQueue[K]) nonEmpty() bool { return q.n.Load() > 0 }

// workers starts runners on the pool.
type workers struct {
	pool   *ants.Pool
	own    bool
	max    int32
	active atomic.Int32 // runners started and not retired
	run    func()       // the scheduler's runner loop; one func value, made once
	more   func() bool  // whether the ready queue holds work
	log    *slog.Logger
	warned atomic.Bool
}

func newWorkers(cfg *config, run func(), more func() bool) (*workers, error) {
	w := &workers{run: run, more: more, log: cfg.logger}
	size := cfg.workers
	if cfg.pool != nil {
		w.pool = cfg.pool
		size = cfg.pool.Cap()
		if size < 0 { // an unbounded ants pool: a given WithMaxConcurrency bounds it
			size = DefaultWorkers
			if cfg.maxConcurrency > 0 {
				size = min(cfg.maxConcurrency, math.MaxInt32)
			}
		}
	} else {
		if size == 0 {
			size = DefaultWorkers
		}
		p, err := ants.NewPool(size)
		if err != nil {
			return nil, &OptionError{Option: "WithWorkers", Value: fmt.Sprint(size), Reason: "ants.NewPool refused it", Err: err}
		}
		w.pool, w.own = p, true
	}
	if cfg.maxConcurrency > 0 && cfg.maxConcurrency < size {
		size = cfg.maxConcurrency
	}
	w.max = int32(size)
	return w, nil
}

// kick starts a runner for work just pushed, if fewer than max are active.
//
// (Measured and rejected: letting a runner that is looking for work take
// the push instead of starting another, and letting idle runners linger
// before they retire. Both kept more runners polling the ready queue and
// contending for its lock, and cost more than starting runners through the
// pool: 15-20% more per task on a submitter-paced stream.)
func (w *workers) kick() {
	if w.reserve() {
		w.start()
	}
}

// reserve takes a runner slot, if fewer than max are active.
func (w *workers) reserve() bool {
	for {
		a := w.active.Load()
		if a >= w.max {
			return false
		}
		if w.active.CompareAndSwap(a, a+1) {
			return true
		}
	}
}

// kickDetached is kick for a caller that must not call the pool at all: a
// worker whose goroutine is ending still counts against the pool's size.
func (w *workers) kickDetached() {
	if w.reserve() {
		go w.submit()
	}
}

func (w *workers) start() {
	// The scheduler's own pool has a worker for every runner slot (at most a
	// worker still on its way back to the pool), so Submit returns at once.
	// A shared pool may be full of other work for as long as that work runs,
	// and ants' Submit cannot be interrupted: wait for it on a goroutine of
	// its own (one per runner slot at most), never in the caller.
	if w.own {
		w.submit()
		return
	}
	go w.submit()
}

func (w *workers) submit() {
	err := w.pool.Submit(w.run)
	switch {
	case err == nil:
	case errors.Is(err, ants.ErrPoolOverload):
		// A shared non-blocking pool is full: try again shortly. The runner
		// slot stays reserved, so the queued work is not forgotten.
		w.warn("keysched: shared ants pool is full; retrying", err)
		time.AfterFunc(time.Millisecond, w.submit)
	default:
		// The pool was released under us (a shared pool released by its
		// owner, or ours after Close gave up): run on a plain goroutine
		// rather than strand accepted work.
		if w.more() {
			w.warn("keysched: ants pool refused work; running it on a plain goroutine", err)
		}
		go w.run()
	}
}

func (w *workers) warn(msg string, err error) {
	if w.warned.CompareAndSwap(false, true) {
		w.log.Warn(msg, "err", err)
	}
}

// retire gives up the caller's runner slot unless more work is ready and no
// other runner would take it. It reports whether the runner should exit.
func (w *workers) retire(more func() bool) bool {
	w.active.Add(-1)
	// A push that happened before the decrement saw active at max and
	// started nobody: it is this runner's to take.
	for more() {
		a := w.active.Load()
		if a >= w.max {
			return true
		}
		if w.active.CompareAndSwap(a, a+1) {
			return false
		}
	}
	return true
}

// releaseNow releases the scheduler's own pool without waiting for its
// workers to exit. A shared pool is left alone.
func (w *workers) releaseNow() {
	if w.own {
		w.pool.Release()
	}
}

// release releases the scheduler's own pool, waiting for its workers to exit
// until ctx ends. A shared pool is left alone.
func (w *workers) release(ctx context.Context) error {
	if !w.own {
		return nil
	}
	// Every task has finished by now: a context that ends while the idle
	// workers exit is no failure; they exit on their own.
	_ = w.pool.ReleaseContext(ctx)
	return nil
}
