package keysched

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// This file holds what Close does once it gives up (its context ended, or a
// later Close's did): abort every task that has not started, have the dead
// letters delivered (concurrently across keys, each key's in its order, in
// one lane per key), settle Stats, and return within CloseGrace whatever is
// left, reporting it.

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
	// ErrAborted (or an error matching it): queued, waiting out a retry
	// backoff or a Snooze, or parked. Those that waited or were parked had
	// run before; NotRun counts them as not running again.
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
	// returned, being delivered still (or queued on their key's lane). The
	// letters of the aborted tasks queued behind a task still running are
	// not among them: they are delivered once that task returns (NotRun
	// counts those tasks).
	Undelivered int
	// Cause is why Close gave up: its context's error, or an error saying
	// that a later Close's context ended.
	Cause error
}

// Error reads as one sentence, the cause first, counts of zero left out:
// "keysched: Close gave up (context deadline exceeded): 770 accepted tasks
// did not run, 2 still running, 3 dead letters not yet delivered".
func (e *CloseError) Error() string {
	var b strings.Builder
	b.WriteString("keysched: Close gave up")
	if e.Cause != nil {
		fmt.Fprintf(&b, " (%v)", e.Cause)
	}
	fmt.Fprintf(&b, ": %d accepted %s did not run", e.NotRun, plural(e.NotRun, "task", "tasks"))
	if e.Running > 0 {
		fmt.Fprintf(&b, ", %d still running", e.Running)
	}
	if e.Unreached > 0 {
		fmt.Fprintf(&b, ", %d not yet reached by the abort", e.Unreached)
	}
	if e.Undelivered > 0 {
		fmt.Fprintf(&b, ", %d dead %s not yet delivered", e.Undelivered, plural(e.Undelivered, "letter", "letters"))
	}
	return b.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
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
		walked := make(chan struct{})
		go func() { // concurrent with settle, which passes what it aborts
			defer close(walked)
			s.abort()
		}()
		s.settle(stop, walked)
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

// letterQueue holds the dead letters of aborted tasks, in one lane per key:
// a lane's letters are delivered one at a time, in the order they were
// queued (its key's chain order: see laneLetter), and lanes are delivered
// concurrently, on up to min(workers, maxDeliverers) goroutines.
type letterQueue[K comparable] struct {
	mu     sync.Mutex
	lanes  map[K]*letterLane[K] // keys with letters queued or being delivered
	ready  []*letterLane[K]     // lanes with letters and no deliverer, in turn
	active int                  // deliverer goroutines
}

// letterLane is one key's queue of dead letters.
type letterLane[K comparable] struct {
	key     K
	letters []DeadLetter[K]
	busy    bool // in ready, or taken by a deliverer
}

// keepAborted makes the dead letter of n, which the caller has just taken
// (stFinishing) from its key's chain to abort it, and keeps it on n until its
// key passes n (laneAborted, then core.passedOn): n is done only once its key
// has passed it and its letter was delivered. It decides n (ErrAborted, or an error matching it); the
// caller publishes it. parked says n was parked (its outcome says so).
func (s *Scheduler[K]) keepAborted(n *node[K], parked bool) {
	c := &n.Completion
	err := abortErr(c, parked)
	dl := s.letter(n, err)
	s.core.holdPassage(c)
	c.extra().aborted = dl // read by laneAborted, once it sees c decided
	s.core.decide(c, outAborted, err)
}

// laneAborted is called by whoever passes c on its key (pass), decided and
// not yet done, before it releases c's pending slot (advance) and drops its
// passage hold (core.passedOn). If c was aborted on its chain (keepAborted),
// its dead letter is held (Stats.Pending and CloseError.Undelivered count it
// from here) and goes to its key's lane now: the key passes its tasks one at
// a time, in its order, so the lane receives them in that order.
func (s *Scheduler[K]) laneAborted(c *Completion) {
	if x := c.more.Load(); x != nil && x.aborted != nil {
		dl := x.aborted.(DeadLetter[K])
		x.aborted = nil
		s.holdLetter()
		s.laneLetter(dl)
	}
}

// laneLetter queues dl (made by letter and held by holdLetter) on its key's
// lane, to be delivered after the letters queued there before it. Callers
// queue a key's letters as the key passes its tasks (pass, step), so each
// key's dead letters are delivered in its order.
func (s *Scheduler[K]) laneLetter(dl DeadLetter[K]) {
	q := &s.letters
	q.mu.Lock()
	if q.lanes == nil {
		q.lanes = make(map[K]*letterLane[K])
	}
	l := q.lanes[dl.Key]
	if l == nil {
		l = &letterLane[K]{key: dl.Key}
		q.lanes[dl.Key] = l
	}
	l.letters = append(l.letters, dl)
	start := false
	if !l.busy {
		l.busy = true
		q.ready = append(q.ready, l)
		start = q.active < min(int(s.workers.max), maxDeliverers)
		if start {
			q.active++
		}
	}
	q.mu.Unlock()
	if start {
		go s.deliverLoop()
	}
}

// deliverLoop delivers lanes until none is waiting: it takes a lane, delivers
// the letters it holds in order, and puts it back at the end of the turn if
// more came meanwhile (so one long lane does not starve the others).
func (s *Scheduler[K]) deliverLoop() {
	q := &s.letters
	q.mu.Lock()
	for len(q.ready) > 0 {
		l := q.ready[0]
		q.ready[0] = nil
		q.ready = q.ready[1:]
		batch := l.letters
		l.letters = nil
		q.mu.Unlock()
		for _, dl := range batch {
			s.sendLetter(dl)
		}
		q.mu.Lock()
		if len(l.letters) > 0 {
			q.ready = append(q.ready, l)
		} else {
			l.busy = false
			delete(q.lanes, l.key)
		}
	}
	q.active--
	q.ready = nil // let the backing array go
	q.mu.Unlock()
}
