package keysched

import (
	"fmt"
	"sync"
	"time"
)

// This file holds what Close does once it gives up (its context ended, or a
// later Close's did): abort every task that has not started, have the dead
// letters delivered concurrently, settle Stats, and return within CloseGrace
// whatever is left, reporting it.

// CloseGrace bounds how long Close runs after it gives up (its context
// ended, or a later Close's did): it returns by then even if dead letters
// are still being delivered or tasks still run, and says so in its
// *CloseError. The bound does not grow with the number of queued tasks:
// aborting them, delivering their dead letters and settling Stats go on in
// the background, and Close only waits for them up to CloseGrace. (On a
// loaded machine the goroutine that runs Close may get the CPU back later
// than that, as with any timer.)
const CloseGrace = 100 * time.Millisecond

// maxDeliverers bounds the goroutines that deliver the dead letters of the
// tasks Close aborted (at most one per worker, and at most this many).
const maxDeliverers = 64

// CloseError is the error of a Close that gave up: its context ended (or a
// later Close's did) before every accepted task finished. It wraps
// ErrAborted and the cause (errors.Is sees both; errors.As finds it, also in
// the bus's errors). The counts are taken when Close returned. Nothing it
// counts is lost: tasks still running finish when they return, and the dead
// letters not yet delivered are still being delivered, in the background;
// each such task's Completion is done once its dead letter was delivered.
type CloseError struct {
	// NotRun counts the accepted tasks this Close completed with
	// ErrAborted: queued, waiting out a retry backoff, or parked.
	NotRun int
	// Running counts the tasks still running when Close returned (a task
	// that ignores its cancelled context keeps its worker until it returns).
	Running int
	// Unreached counts the accepted tasks that were neither finished nor
	// running when Close returned: the abort had not reached them yet (a
	// backlog too long to walk within CloseGrace). They are aborted and
	// dead-lettered in the background, as the others.
	Unreached int
	// Undelivered counts the dead letters not yet delivered when Close
	// returned, being delivered still.
	Undelivered int
	// Cause is why Close gave up: its context's error, or an error saying
	// that a later Close's context ended.
	Cause error
}

func (e *CloseError) Error() string {
	return fmt.Sprintf("keysched: close: %d accepted tasks did not run (%v), %d still running, %d not yet aborted, %d dead letters not yet delivered: %v",
		e.NotRun, ErrAborted, e.Running, e.Unreached, e.Undelivered, e.Cause)
}

// Unwrap returns ErrAborted and the cause.
func (e *CloseError) Unwrap() []error { return []error{ErrAborted, e.Cause} }

// giveUpOnTasks is Close's abort: everything that has not started is
// completed with ErrAborted, running tasks' contexts are cancelled, and Close
// waits up to CloseGrace for the dead letters and the keys to settle.
func (s *Scheduler[K]) giveUpOnTasks(cause error) error {
	before := s.core.notRun.Load()
	s.core.aborting.Store(true)
	s.core.cancelWatched()
	stop, settled := make(chan struct{}), make(chan struct{})
	go func() { // it ends once the walk is done and Stats settled, or stop
		defer close(settled)
		s.abort()
		s.settle(stop)
	}()
	t := time.NewTimer(CloseGrace)
	select {
	case <-settled:
		t.Stop()
	case <-t.C:
		close(stop)
	}
	k := &s.core
	running := k.running.Value()
	unreached := k.submitted.Value() - running
	for _, o := range k.outcomes {
		unreached -= o.Value()
	}
	return &CloseError{
		NotRun:      int(k.notRun.Load() - before),
		Running:     int(running),
		Unreached:   int(max(0, unreached)),
		Undelivered: int(k.delivering.Load()),
		Cause:       cause,
	}
}

// letterQueue holds the dead letters of aborted tasks, in batches (one
// chain's letters, delivered in its order), for up to maxDeliverers
// goroutines.
type letterQueue[K comparable] struct {
	mu      sync.Mutex
	batches [][]DeadLetter[K]
	active  int
}

// deliverLater has the dead letters of aborted tasks (held by holdLetter)
// delivered by a deliverer goroutine, in order within the batch; batches go
// concurrently, on up to min(workers, maxDeliverers) goroutines.
func (s *Scheduler[K]) deliverLater(batch []DeadLetter[K]) {
	q := &s.letters
	q.mu.Lock()
	q.batches = append(q.batches, batch)
	start := q.active < min(int(s.workers.max), maxDeliverers)
	if start {
		q.active++
	}
	q.mu.Unlock()
	if start {
		go s.deliverLoop()
	}
}

func (s *Scheduler[K]) deliverLoop() {
	q := &s.letters
	for {
		q.mu.Lock()
		if len(q.batches) == 0 {
			q.active--
			q.batches = nil // let the backing array go
			q.mu.Unlock()
			return
		}
		batch := q.batches[0]
		q.batches[0] = nil
		q.batches = q.batches[1:]
		q.mu.Unlock()
		for _, dl := range batch {
			s.sendLetter(dl)
		}
	}
}
