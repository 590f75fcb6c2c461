package keysched

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
)

// This file holds the scheduler's shutdown: Drain, Close (at the end of the
// file), and what Close does once it gives up (its context ended, or a
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
	// that a later Close's context ended, wrapping that context's error
	// (and its cause, when one was given: context.WithTimeoutCause).
	Cause error
}

// Error reads as one sentence, the cause first, counts of zero left out:
// "keysched: Close gave up (context deadline exceeded): 770 accepted tasks
// did not run or will not run again, 2 still running, 3 dead letters not yet
// delivered" (NotRun: queued tasks that did not run, and tasks that had run
// and were parked or waiting to run again, which will not run again).
func (e *CloseError) Error() string {
	var b strings.Builder
	b.WriteString("keysched: Close gave up")
	if e.Cause != nil {
		fmt.Fprintf(&b, " (%v)", e.Cause)
	}
	// NotRun includes tasks that had run (parked, or waiting to run again):
	// "did not run" alone would be untrue of them.
	fmt.Fprintf(&b, ": %d accepted %s did not run or will not run again", e.NotRun, plural(e.NotRun, "task", "tasks"))
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

// Drain waits until every task accepted so far has finished, or ctx ends.
// With submitters still at work it may also wait for tasks accepted while it
// waits: it returns when none is pending. Parked keys (FailurePolicy Park)
// hold unfinished tasks: Drain waits for them to be resumed or skipped.
// When ctx ends first it returns an error wrapping ctx's error that says how
// many tasks are unfinished, how many keys are parked and how many tasks are
// waiting to run again (a retry backoff, or a Snooze: a task that snoozes for
// ever holds its key for ever, and Drain waits for it). With a task's context
// it returns ErrInsideTask; called from a task with another context, it waits
// for that task, until that context ends (see Close).
func (s *Scheduler[K]) Drain(ctx context.Context) error {
	if s.zero() {
		return ErrZeroScheduler
	}
	if ctx == nil {
		return ErrNilContext
	}
	if inTask(ctx) {
		return ErrInsideTask
	}
	if err := s.pending.waitIdle(ctx, nil); err != nil {
		return fmt.Errorf("keysched: drain: %d tasks unfinished, %d keys parked, %d tasks waiting to run again (retry backoff or Snooze): %w",
			s.pending.count(), s.parkedCount(), s.core.waiting.Load(), err)
	}
	s.awaitPassing()
	return nil
}

// awaitPassing waits for the Completions that runners are about to make done
// after releasing their pending slots (only once Close has given up: see
// pass). Those runners run no user code in that window.
func (s *Scheduler[K]) awaitPassing() {
	for s.core.passing.Load() != 0 {
		runtime.Gosched()
	}
}

// Close shuts the scheduler down. From the moment it starts, Submit and
// TrySubmit fail with ErrClosed (decided atomically with the enqueue: a task
// is either accepted, and then run or aborted, or refused) and waiting
// submitters are woken with it. Accepted tasks finish (a parked key counts
// as unfinished until Resume or Skip); then Close releases the scheduler's
// own pool (not one given with WithPool) and returns nil.
//
// If ctx ends first, Close gives up: it cancels the contexts of running
// tasks, completes every task that has not started (including retries
// waiting out a backoff and parked keys) with ErrAborted and hands those to
// the dead-letter function, and returns a *CloseError (wrapping ErrAborted
// and ctx's error) that says how many did not run or, parked or waiting to
// run again, will not run again. It returns within
// CloseGrace (100 ms) of giving up, however long the backlog: the aborted
// tasks' dead letters are delivered concurrently across keys (on up to one
// goroutine per worker, at most 64) and one at a time per key, in the key's
// order: an aborted task's letter is delivered once its key has passed it,
// so the letters of the tasks queued behind a task still running (which
// hold their slots anyway) come after that task returns and after its own
// dead letter, if it has one. What is not finished
// by then (dead letters still being delivered, tasks still running, a
// backlog not yet walked) is counted in the *CloseError and goes on in the
// background; nothing is dropped. Drain after such a Close waits for that
// background work (a process about to exit should call it, with a deadline
// of its own, or the letters still being delivered are lost with the
// process). A task that ignores its context keeps its worker until it
// returns.
//
// Close is idempotent: later calls wait for the first to finish and return
// its result; if a later call's ctx ends first, the first Close gives up as
// if its own had ended (so a Close(context.Background()) waiting on a parked
// key can be escalated), and both return a *CloseError whose Cause says so
// and wraps that ctx's error. With a task's context it returns ErrInsideTask and
// does nothing.
//
// Called from inside a task with any other context (context.Background(),
// say), Close waits for that very task, which waits for Close: it never
// returns, and no error says why. The scheduler knows a task only by its
// context (Go has no goroutine identity to recognise the calling task by),
// so pass the task's context, or call Close from outside the tasks. A Close
// still waiting after CloseWaitWarning logs one warning (WithLogger, level
// Warn) with the counts of what it waits for: running tasks, parked keys
// (they wait for Resume or Skip), tasks waiting to run again.
//
// When it returns with an error, tasks still running (and the aborted tasks
// queued behind them) and dead letters still being delivered hold their
// slots in Stats until they are done; each such task's Completion is done
// once its key no longer counts it and its dead letter was delivered, so
// once every Completion is done Stats is settled.
func (s *Scheduler[K]) Close(ctx context.Context) error {
	if s.zero() {
		return ErrZeroScheduler
	}
	if ctx == nil {
		return ErrNilContext
	}
	if inTask(ctx) {
		return ErrInsideTask
	}
	first := false
	s.closeOnce.Do(func() { first = true })
	if !first {
		select {
		case <-s.closed:
			return s.closeErr
		case <-ctx.Done():
			// Escalate: the first Close gives up now too, its cause
			// wrapping this ctx's error (errors.Is(err,
			// context.DeadlineExceeded) holds for the caller whose
			// deadline it was).
			s.giveUpOne.Do(func() {
				s.giveUpWhy = ctx.Err()
				if c := context.Cause(ctx); c != nil && c != s.giveUpWhy { //nolint:errorlint // the cause given, if any
					// A cause of the caller's (WithTimeoutCause): both
					// match, as the doc promises ctx's error.
					s.giveUpWhy = fmt.Errorf("%w: %w", s.giveUpWhy, c)
				}
				close(s.giveUp)
			})
			<-s.closed
			return s.closeErr
		}
	}
	s.pending.close()
	close(s.closing)
	var err error
	warn := time.AfterFunc(CloseWaitWarning, s.warnCloseWaits)
	werr := s.pending.waitIdle(ctx, s.giveUp)
	warn.Stop()
	if werr != nil {
		if werr == errGaveUp { //nolint:errorlint // waitIdle's own value
			werr = fmt.Errorf("%w: %w", errGaveUp, s.giveUpWhy)
		}
		err = s.giveUpOnTasks(werr) // close.go
		s.workers.releaseNow()
	} else {
		// Every task and dead letter is done: only idle workers are left to
		// exit. A later Close giving up need not wait for them either.
		rctx, cancel := context.WithCancel(ctx)
		giveUp := s.giveUp // not s: this goroutine may outlive Close by a moment
		go func() {
			select {
			case <-giveUp:
				cancel()
			case <-rctx.Done():
			}
		}()
		if rerr := s.workers.release(rctx); rerr != nil {
			err = fmt.Errorf("keysched: close: releasing the pool: %w", rerr)
		}
		cancel()
	}
	s.closeErr = err
	close(s.closed)
	return err
}

// CloseWaitWarning is how long a Close waits for unfinished tasks before it
// logs one warning (see Close): a Close that never returns is otherwise
// silent.
const CloseWaitWarning = 10 * time.Second

// warnCloseWaits logs that Close is still waiting, with what it waits for
// and the one hang it cannot detect (see Close).
func (s *Scheduler[K]) warnCloseWaits() {
	defer func() { _ = recover() }() // a logger that panics: Close goes on waiting
	st := s.Stats()
	s.cfg.logger.Warn(closeWaitsMessage(st.Running, st.ParkedKeys),
		"waited", CloseWaitWarning, "pending", st.Pending, "running", st.Running,
		"parked_keys", st.ParkedKeys, "waiting_to_run_again", s.core.waiting.Load())
}

// closeWaitsMessage is warnCloseWaits' message: what Close waits for, with
// the hint that fits it (parked keys wait for an operator; running tasks may
// be the one hang Close cannot detect).
func closeWaitsMessage(running, parkedKeys int) string {
	msg := "keysched: Close still waiting for unfinished tasks"
	if parkedKeys > 0 {
		msg += "; parked keys wait for Resume or Skip (or for Close's context to end)"
	}
	if running > 0 {
		msg += "; a task that calls Close, or Waits for a later task of its own key, with a context " +
			"other than its own waits for ever (pass the task's context: ErrInsideTask, ErrDeadlock)"
	}
	return msg
}

// abort gives up on every task that has not started: Close's context ended.
// (Each task it completes with ErrAborted is counted in core.notRun.) The
// caller has set core.aborting and cancelled the running tasks' contexts.
func (s *Scheduler[K]) abort() {
	s.tails.m.Range(func(_ K, ch *chainHdr) bool {
		s.abortChain(ch)
		return true
	})
}

// settle moves keys past the tasks abort finished, so that Stats and
// KeyDepth count only what is still held by running tasks (and queued behind
// them), and so that their dead letters go to their keys' lanes (passing a
// key hands them over, in its order). It takes what is in the ready queue
// itself (step runs no task while the scheduler aborts: it finishes them),
// while the walk (abort) goes on, until walked is closed; then it waits for
// runners that are moving keys on and for dead letters being delivered,
// until stop is closed. Once stop is closed it still waits for the walk and
// passes what the walk left in the ready queue, so that no key is left
// unpassed (Close has returned by then).
func (s *Scheduler[K]) settle(stop, walked <-chan struct{}) {
	for i := 0; ; i++ {
		walkDone := isClosed(walked) // before passReady: it passes all the walk left
		s.passReady()
		if walkDone && s.core.delivering.Load() == 0 && s.core.passing.Load() == 0 && s.pending.count() <= s.heldByRunning() {
			return
		}
		if isClosed(stop) {
			<-walked
			s.passReady()
			return
		}
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// passReady takes the keys in the ready queue and passes their finished
// tasks (see settle).
func (s *Scheduler[K]) passReady() {
	for n := s.ready.pop(); n != nil; n = s.ready.pop() {
		for n != nil && s.step(n, nil) {
			n = s.pass(n)
		}
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// heldByRunning counts the tasks of keys whose head's task function is still
// running: what Close cannot settle while it waits for no one. (A head whose
// attempt has returned is being finished by its worker: that settles.)
func (s *Scheduler[K]) heldByRunning() int64 {
	var held int64
	s.tails.m.Range(func(_ K, ch *chainHdr) bool {
		if h := ch.head.Load(); h != nil && h.state.Load() == stRunning && !attemptEnded(h) {
			held += ch.depth.Load()
		}
		return true
	})
	return held
}

// abortChain aborts the unstarted tasks of one chain, from its head on. The
// head pointer may lag behind a runner that is moving the key on; a node the
// key has moved past has the passed sentinel as its next, and the head has
// been moved beyond it before: so from there, go on at the head. A node whose
// next is nil is the tail: stop.
func (s *Scheduler[K]) abortChain(ch *chainHdr) {
	var n *node[K]
	if h := ch.head.Load(); h != nil {
		n = nodeOf[K](h)
	}
	for n != nil {
		s.takeAborted(n)
		next := n.next.Load()
		if next == s.passed {
			next = nil
			if h := ch.head.Load(); h != &n.Completion { // else the key drained at n
				next = nodeOf[K](h)
			}
		}
		n = next
	}
}

// abortNode completes n with ErrAborted if it has not started; its dead
// letter is delivered once its key passes it (see takeAborted).
func (s *Scheduler[K]) abortNode(n *node[K]) { s.takeAborted(n) }

// takeAborted completes n with ErrAborted if it has not started, and keeps
// its dead letter on n: n is still on its key's chain, and whoever passes it
// there (its key's runner, or Close's settle) hands the letter to the key's
// lane (laneAborted), so that the key's dead letters are delivered in its order,
// after those of the tasks before n (n's own pending slot counts it until
// then). n is done once its letter was delivered.
func (s *Scheduler[K]) takeAborted(n *node[K]) bool {
	c := &n.Completion
	for {
		switch st := c.state.Load(); st {
		case stQueued, stWaiting, stParked:
			if !c.state.CompareAndSwap(st, stFinishing) {
				continue
			}
			// No user code between taking it and deciding it (see step).
			s.keepAborted(n, st == stParked)
			s.core.notRun.Add(1)
			if st != stQueued {
				s.wakeStalled(c, st)
			}
			s.core.publish(c)
			return true
		default:
			return false
		}
	}
}
