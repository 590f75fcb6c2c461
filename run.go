package keysched

import (
	"context"
	"errors"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// This file runs tasks: the runner loop, one attempt of a task, what follows
// a failure (retry, dead letter, park), and handing a key on to its next task.

// runLoop is the function every runner executes on a pool worker.
func (s *Scheduler[K]) runLoop() {
	var cur *node[K]  // the task being run, for the Goexit path below
	var clk handClock // an observer's clock reading handed from a task to its key's next
	clean := false
	defer func() {
		if !clean {
			// Only runtime.Goexit inside a task gets here (panics are
			// recovered in call): the worker goroutine is ending, so finish
			// its task and hand its key and its runner slot on.
			s.goexit(cur)
		}
	}()
	for {
		n := s.ready.pop()
		if n == nil {
			if s.workers.retire(s.ready.nonEmpty) {
				clean = true
				return
			}
			continue
		}
		// Run n and its key's successors on this worker, in a loop (never by
		// recursion: a chain may be millions long), then yield the key.
		clk.ok = false // a reading from another key's task is not reused
		for budget := keyBudget; ; budget-- {
			cur = n
			if !s.step(n, &clk) {
				break // waiting for a retry, or parked: the key is held
			}
			next := s.pass(n)
			if next == nil {
				break
			}
			if budget == 1 {
				s.ready.push(next) // back of the queue: other keys go first
				break
			}
			n = next
		}
	}
}

// A handClock carries the clock reading an observed attempt ended with to the
// start of the next task of the same key on the same runner (see attempt).
type handClock struct {
	at Mono
	ok bool
}

// step runs n if it is still to run. It reports whether n is finished, so
// that its key moves on; false means n holds its key (retry wait or parked).
// clk is the runner's hand-over reading (nil: none).
func (s *Scheduler[K]) step(n *node[K], clk *handClock) bool {
	c := &n.Completion
	for {
		switch from := c.state.Load(); from {
		case stQueued, stWaiting:
			if !c.state.CompareAndSwap(from, stRunning) {
				continue
			}
			if out, stop := s.stopped(c); stop {
				// Close is giving up, or a Cancel came while the task was
				// between attempts (it saw it running, and set its flag):
				// it does not run again. Finished before its dead letter is
				// delivered, as abortNode does.
				if out == outAborted {
					err := abortErr(c, false)
					dl := s.letter(n, err)
					s.holdLetter()
					s.core.decide(c, outAborted, err)
					s.core.notRun.Add(1)
					s.laneLetter(dl) // after the letters of the tasks passed before n
				} else {
					s.core.decide(c, outCancelled, context.Canceled)
				}
				s.publishRun(c)
				return true
			}
			return s.attempt(n, clk)
		case stFinishing:
			// Cancel or Close's abort has taken it and is writing its
			// outcome (no user code runs in that window): wait for the
			// outcome, so that nobody sees the key move past an unfinished
			// task.
			runtime.Gosched()
		default:
			// Done: cancelled or aborted while it waited, a tombstone.
			return true
		}
	}
}

// attempt runs one attempt of n, which this runner owns (stRunning).
//
// With an observer, an attempt costs one clock reading, not two, when it
// follows its key's previous task on the same runner: that task's end
// reading (clk, set only after a successful first attempt, whose runner went
// straight on through pass) is reused as this attempt's start, when n was
// accepted before it. The reading is then taken at most one hand-over (pass:
// no user code, no waiting) before the task function is called, never before
// the predecessor's end nor before n's acceptance, so the documented order
// Accepted <= Started <= Ended, and the key's order of attempts, hold.
func (s *Scheduler[K]) attempt(n *node[K], clk *handClock) bool {
	c := &n.Completion
	var err error
	var panicked bool
	var v verdict
	var started Mono
	if s.obs != nil {
		started = s.hookStarted(n, clk)
	}
	if x := c.more.Load(); x == nil && s.cfg.taskTimeout == 0 {
		// The common case: a first attempt, its context inline.
		c.ctxBits.Or(ctxStarted)
		s.core.running.Inc()
		err, panicked = call(c.task, taskContext{c})
		s.core.running.Dec()
		s.endAttempt(c, nil)
	} else {
		x := c.extra()
		a := &attemptState{c: c, n: x.attempts.Add(1)}
		if d := s.cfg.taskTimeout; d > 0 {
			a.deadline = time.Now().Add(d)
			a.timer = time.AfterFunc(d, a.expire)
		}
		x.cur.Store(a)
		s.core.running.Inc()
		err, panicked = call(c.task, attemptContext{a})
		s.core.running.Dec()
		s.endAttempt(c, a)
	}
	if err != nil && !panicked {
		v, err, panicked = judge(err)
	}
	if s.obs != nil {
		s.hookEnded(n, started, err, panicked, clk)
	}
	if err == nil {
		s.core.decide(c, outSucceeded, nil)
		s.publishRun(c)
		return true
	}
	return s.failed(n, err, panicked, v)
}

// call runs the task, turning a panic into a *PanicError.
func call[C context.Context](t Task, ctx C) (err error, panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			err, panicked = &PanicError{Value: r, Stack: debug.Stack()}, true
		}
	}()
	return t(ctx), false
}

// verdict is what a failed run's error asks for (see judge).
type verdict struct {
	permanent bool          // Permanent: fail now
	snooze    bool          // Snooze: not an attempt, run again after
	after     time.Duration // Snooze's delay argument
}

// judge reads the error a run returned (not a panic): Permanent anywhere in
// its chain wins over Snooze. errors.As runs the error's own methods, user
// code that may panic too: such a panic is the run's, as if the task itself
// had panicked (it replaces err).
func judge(err error) (v verdict, out error, panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			v, out, panicked = verdict{}, &PanicError{Value: r, Stack: debug.Stack()}, true
		}
	}()
	if IsPermanent(err) {
		return verdict{permanent: true}, err, false
	}
	var z *snoozeError
	if errors.As(err, &z) {
		return verdict{snooze: true, after: z.after}, err, false
	}
	return verdict{}, err, false
}

// attemptEnded reports whether n's latest attempt has returned (its context
// is marked ended), telling runLoop's Goexit path whether the unwinding came
// from the task itself.
func attemptEnded(c *Completion) bool {
	if x := c.more.Load(); x != nil {
		if a := x.cur.Load(); a != nil && a.n == x.attempts.Load() {
			return a.bits.Load()&ctxEnded != 0
		}
	}
	return c.ctxBits.Load()&ctxEnded != 0
}

// endAttempt ends c's attempt that has just returned (or unwound): it stops
// the attempt's timer, cancels its context, as net/http does when a handler
// returns, and forgets it. a is the attempt's state; nil for the inline
// first attempt, whose flags are c.ctxBits and whose Done channel, if made,
// lives in c's signals.
func (s *Scheduler[K]) endAttempt(c *Completion, a *attemptState) {
	bits := &c.ctxBits
	if a != nil {
		if a.timer != nil {
			a.timer.Stop()
		}
		bits = &a.bits
	}
	if old := bits.Or(ctxCancelled | ctxEnded); old&ctxWatched != 0 {
		var done *lazyChan
		if a != nil {
			done = &a.done
		} else {
			done = &c.sig.Load().ctxDone // watched: made, so signals exist
		}
		done.close()
		s.core.unwatch(done)
	}
}

// failed decides what follows a failed attempt. It reports whether n is
// finished (false: n waits for a retry or is parked, holding its key).
func (s *Scheduler[K]) failed(n *node[K], err error, panicked bool, v verdict) bool {
	c := &n.Completion
	x := c.extra()
	if v.snooze && !panicked {
		if _, stop := s.stopped(c); !stop {
			// Not an attempt (see Snooze): give its number back, so that
			// neither the budget, nor Attempt, nor the dead letter counts it.
			x.attempts.Add(-1)
			s.core.snoozed.Add(1)
			return s.wait(n, err, s.cfg.retry.snoozeDelay(v.after), true)
		}
		// Cancelled or aborted while running: its error is the outcome,
		// counted as the last attempt like any other (below).
	}
	rec := &x.fail
	rec.record(err)

	// Cancelled (Completion.Cancel) or aborted (Close's context ended) while
	// running: never retried.
	if out, stop := s.stopped(c); stop {
		s.deliver(s.letter(n, err))
		s.core.decide(c, out, err)
		s.publishRun(c)
		return true
	}
	retryable := !v.permanent && (!panicked || s.cfg.retryPanics)
	made := int(x.attempts.Load()) - rec.base
	if retryable && made < s.cfg.retry.MaxAttempts {
		s.core.retried.Add(1)
		return s.wait(n, err, s.cfg.retry.delay(made+1), false)
	}
	if s.cfg.failure == Park {
		return s.parkFailed(n, err)
	}
	out := outFailed
	if panicked {
		out = outPanicked
	}
	s.deliver(s.letter(n, err))
	s.core.decide(c, out, err)
	s.publishRun(c)
	return true
}

// stopped reports whether Cancel or Close's abort asked n to stop, and the
// outcome that makes.
func (s *Scheduler[K]) stopped(c *Completion) (int, bool) {
	if c.ctxBits.Load()&ctxCancelReq != 0 {
		return outCancelled, true
	}
	if s.core.aborting.Load() {
		return outAborted, true
	}
	return 0, false
}

// A task waiting (a retry backoff) or parked can be taken by Cancel or Close's
// abort at any moment, by a CompareAndSwap out of stWaiting or stParked. Each
// wait has a hand-back token: whoever takes it (the backoff's timer, or
// wakeStalled for Cancel and the abort) puts the task back in the ready queue,
// exactly once. A Cancel or abort that came while the task still ran only set
// its flag: after publishing the new state the runner looks at the flags
// again and takes the task back itself (the flags and the state are both
// atomics: either the runner sees the flag or the Cancel sees the state).

// wait puts n, which failed (or snoozed: its run not counted), into a
// backoff of d. It reports whether n is finished after all (a Cancel or abort
// came meanwhile).
func (s *Scheduler[K]) wait(n *node[K], err error, d time.Duration, snoozed bool) bool {
	c := &n.Completion
	x := c.more.Load()
	rec := &x.fail
	w := &backoff{k: &s.core}
	rec.wait = w // published by the state Store below
	s.core.waiting.Add(1)
	c.state.Store(stWaiting)
	w.timer.Store(time.AfterFunc(d, func() {
		if w.take() {
			s.requeue(n)
		}
	}))
	if w.back.Load() {
		// wakeStalled took the token before the timer was published: it
		// could not stop it, so stop it here (it would keep n, and the
		// scheduler, reachable until it fires).
		w.timer.Load().Stop()
	}
	// Take the hand-back token first: from then on neither the timer nor a
	// Cancel's wakeStalled will put n back, so n cannot move on (or run
	// again) while this runner decides. If the timer has taken it already,
	// n is someone else's now: leave it (step honours the flags).
	if _, stop := s.stopped(c); stop && w.take() {
		w.timer.Load().Stop()
		if out, _ := s.stopped(c); c.state.CompareAndSwap(stWaiting, stFinishing) {
			if snoozed {
				// Stopped before it waited: like a run cancelled while
				// running (see failed), its error ends it, as an attempt.
				x.attempts.Add(1)
				rec.record(err)
			}
			dl := s.letter(n, err)
			s.core.decide(c, out, err)
			s.deliver(dl)
			s.publishRun(c)
			return true
		}
		// Cancel or the abort took and finished it; its wakeStalled found
		// the token gone: hand it back here, so its key moves on.
		s.requeue(n)
	}
	return false
}

// backoff is one retry (or snooze) wait: its timer and its hand-back token.
type backoff struct {
	back  atomic.Bool
	timer atomic.Pointer[time.Timer]
	k     *core // its waiting count
}

// take takes the hand-back token; the one caller it reports true to ends
// the wait (core.waiting no longer counts it).
func (w *backoff) take() bool {
	if w.back.CompareAndSwap(false, true) {
		w.k.waiting.Add(-1)
		return true
	}
	return false
}

// parkFailed parks n's key with n, which failed for good, at its head, then
// delivers its dead letter (so the dead-letter function sees the key parked).
func (s *Scheduler[K]) parkFailed(n *node[K], err error) bool {
	c := &n.Completion
	dl := s.letter(n, err)
	s.holdLetter() // before a Skip can move the key past n: Drain counts it
	s.park(n)
	if out, stop := s.stopped(c); stop && c.state.CompareAndSwap(stParked, stFinishing) {
		s.dropParked(n)
		s.core.decide(c, out, err)
		s.sendLetter(dl)
		s.publishRun(c)
		return true
	}
	s.sendLetter(dl)
	return false
}

// letter describes n, which failed for good with err. It copies what it
// needs, so that it can be delivered after n was finished or parked (and
// may already be running again, resumed).
//
// It counts the letter as being delivered (deliver ends it): until it is, n's
// Completion is not done, whoever decides n meanwhile.
func (s *Scheduler[K]) letter(n *node[K], err error) DeadLetter[K] {
	c := &n.Completion
	c.ctxBits.Add(dlUnit)
	dl := DeadLetter[K]{Key: n.key, Task: c.task, Err: err, Attempts: c.attempts(), Context: dlContext{c}}
	if x := c.more.Load(); x != nil && x.fail.errs != nil {
		dl.Attempts -= x.fail.base
		dl.Errors = append([]error(nil), x.fail.errs...)
		dl.FirstAttempt, dl.LastAttempt = x.fail.first, x.fail.last
	} else {
		dl.Errors = []error{err}
	}
	return dl
}

// deliver hands dl, made by letter, to the dead-letter function, or logs it
// when there is none. Either is user code (the logger's handler too): it runs
// on a goroutine of its own while the caller waits, so that a panic in it is
// recovered and logged, and a runtime.Goexit (t.FailNow in a test's
// callback) ends that goroutine, not the worker.
//
// While it runs it holds a pending slot (Stats.Pending counts it), so that
// Drain and Close wait for it: a dead-letter function may Skip or Resume the
// very key it reports, and then must not outlive Close. When it returns, the
// task is published if it was decided meanwhile (a Skip, Cancel or abort of
// the parked task, or its resumed run): normally before the slot is released,
// so that Drain returns only once every Completion is done; once Close has
// given up, after, so that a Completion done then is no longer in Stats.
func (s *Scheduler[K]) deliver(dl DeadLetter[K]) {
	s.holdLetter()
	s.sendLetter(dl)
}

// holdLetter counts a dead letter as being delivered, in Stats.Pending too,
// until sendLetter has delivered it.
func (s *Scheduler[K]) holdLetter() {
	s.core.delivering.Add(1)
	s.pending.hold()
}

// sendLetter delivers dl, held by holdLetter, and waits for the delivery.
func (s *Scheduler[K]) sendLetter(dl DeadLetter[K]) {
	c := dl.Context.(dlContext).c
	s.core.deadLettered.Add(1)
	if s.obs != nil {
		s.hookDeadLettered(dl.Key, dl.Err)
	}
	defer func() {
		if s.core.aborting.Load() {
			s.core.passing.Add(1) // see pass
			s.pending.release()
			s.core.endLetter(c)
			s.core.passing.Add(-1)
		} else {
			s.core.endLetter(c)
			s.pending.release()
		}
		s.core.delivering.Add(-1)
	}()
	done := make(chan struct{})
	go func() {
		returned := false
		defer func() {
			r := recover()
			if !returned {
				func() {
					defer func() { _ = recover() }() // a logger that panics too
					s.cfg.logger.Error("keysched: dead-letter function or logger did not return",
						"key", dl.Key, "panic", r, "err", dl.Err)
				}()
			}
			close(done)
		}()
		if s.dlq == nil {
			if dl.Err == ErrAborted { //nolint:errorlint // only the sentinel itself: a task that never ran
				// Never ran: Close gave up on it. Close's *CloseError counts
				// these (NotRun), so one line each would only flood the log
				// of a process shutting down with a backlog.
				s.cfg.logger.Debug("keysched: task aborted by Close before it ran", "key", dl.Key)
			} else {
				s.cfg.logger.Warn("keysched: task failed", "key", dl.Key, "attempts", dl.Attempts, "err", dl.Err)
			}
		} else {
			s.dlq(dl)
		}
		returned = true
	}()
	<-done
}

// advance hands n's key on after n finished: to n's successor, or, when n was
// the tail, removes the key. It releases n's depth and pending slots and
// returns the successor to run next (nil if none).
func (s *Scheduler[K]) advance(n *node[K]) *node[K] {
	ch := n.hdr
	next := n.next.Load()
	if next == nil {
		next = s.tails.removeIfTail(n)
	}
	if next != nil {
		ch.head.Store(&next.Completion)
	}
	// n is behind the head now: drop the link, so that a Completion a caller
	// keeps does not keep its key's later tasks alive, and mark n passed for
	// Close's abort walk (see abortChain).
	n.next.Store(s.passed)
	ch.depth.Add(-1)
	if ch.waiters.Load() > 0 {
		s.wakeKey(ch)
	}
	s.pending.release()
	return next
}

// publishRun publishes c, which its runner decided, unless Close has given
// up: then pass publishes it once its key has moved past it.
func (s *Scheduler[K]) publishRun(c *Completion) {
	if !s.core.aborting.Load() {
		s.core.publish(c)
	}
}

// pass hands n's key on (advance) and returns the task to run next. If n is
// decided but not yet done (its runner decided it after Close gave up, or its
// dead letter is still being delivered), the tasks behind n that are finished
// already (aborted by Close) are passed too before n is published: once the
// Completion of a task that Close left running is done, Stats no longer
// counts it, its key or the aborted tasks behind it.
//
// Between the two, core.passing counts it: Close and Drain, which see the
// pending count reach zero first, wait for it so that every Completion is
// done when they return.
func (s *Scheduler[K]) pass(n *node[K]) *node[K] {
	c := &n.Completion
	if c.state.Load() != stDecided {
		return s.advance(n) // the common case: done already
	}
	s.core.passing.Add(1)
	s.laneAborted(c) // n's dead letter before those of the tasks behind it
	next := s.advance(n)
	for next != nil && next.state.Load() >= stDecided {
		t := &next.Completion
		s.laneAborted(t) // before advance releases its slot: Drain waits for the letter
		next = s.advance(next)
		if t.state.Load() == stDecided {
			s.core.passedOn(t)
		}
	}
	s.core.passedOn(c)
	s.core.passing.Add(-1)
	return next
}

// requeue hands a task that waited (a retry timer fired, Resume, or a Cancel
// or abort that took a waiting or parked task) back to a runner.
func (s *Scheduler[K]) requeue(n *node[K]) {
	s.ready.push(n)
	s.workers.kick()
}

// wakeStalled is called when Cancel or Close's abort took (and finished) a
// task that was waiting for a retry or parked, so its key moves on now.
func (s *Scheduler[K]) wakeStalled(c *Completion, from uint32) {
	n := nodeOf[K](c)
	switch from {
	case stWaiting:
		w := c.more.Load().fail.wait
		if w.take() {
			if t := w.timer.Load(); t != nil {
				t.Stop() // else wait stops it once it has published it
			}
			s.requeue(n)
		} // else its timer has handed it back, or the runner took it
	case stParked:
		s.dropParked(n)
		s.requeue(n)
	}
}

// goexit is runLoop's way out when its goroutine unwinds without returning.
// A task that called runtime.Goexit (t.FailNow does) is finished as a panic
// and its key handed on; either way the exiting worker's runner slot is
// handed on.
func (s *Scheduler[K]) goexit(cur *node[K]) {
	if cur != nil && cur.state.Load() == stRunning && !attemptEnded(&cur.Completion) {
		c := &cur.Completion
		s.core.running.Dec()
		var a *attemptState // nil: the inline first attempt
		if x := c.more.Load(); x != nil {
			a = x.cur.Load()
		}
		s.endAttempt(c, a)
		if s.failed(cur, &PanicError{Value: errGoexit, Stack: debug.Stack()}, true, verdict{}) {
			if next := s.pass(cur); next != nil {
				s.ready.push(next)
			}
		}
	}
	// This worker is still counted by the pool until its goroutine ends, so
	// starting the next runner must not wait for the pool here.
	s.workers.active.Add(-1)
	if s.ready.nonEmpty() {
		s.workers.kickDetached()
	}
}
