package keysched

import (
	"context"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// This file runs tasks: the runner loop, one attempt of a task, what follows
// a failure (retry, dead letter, park), and handing a key on to its next task.

// runLoop is the function every runner executes on a pool worker.
func (s *Scheduler[K]) runLoop() {
	var cur *node[K] // the task being run, for the Goexit path below
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
		for budget := keyBudget; ; budget-- {
			cur = n
			if !s.step(n) {
				break // waiting for a retry, or parked: the key is held
			}
			next := s.advance(n)
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

// step runs n if it is still to run. It reports whether n is finished, so
// that its key moves on; false means n holds its key (retry wait or parked).
func (s *Scheduler[K]) step(n *node[K]) bool {
	c := &n.Completion
	from := c.state.Load()
	if (from != stQueued && from != stWaiting) || !c.state.CompareAndSwap(from, stRunning) {
		// Cancelled or aborted while queued: a tombstone, just move on.
		return true
	}
	if s.core.aborting.Load() {
		s.deadLetter(n, ErrAborted)
		s.core.finish(c, outAborted, ErrAborted)
		return true
	}
	return s.attempt(n)
}

// attempt runs one attempt of n, which this runner owns (stRunning).
func (s *Scheduler[K]) attempt(n *node[K]) bool {
	c := &n.Completion
	var err error
	var panicked bool
	if x := c.more.Load(); x == nil && s.cfg.taskTimeout == 0 {
		// The common case: a first attempt, its context inline.
		c.ctxBits.Or(ctxStarted)
		s.core.running.Inc()
		err, panicked = call(c.task, taskContext{c})
		s.core.running.Dec()
		s.endFirstAttempt(c)
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
		if a.timer != nil {
			a.timer.Stop()
		}
		s.endAttempt(&a.bits, &a.done)
	}
	if err == nil {
		s.core.finish(c, outSucceeded, nil)
		return true
	}
	return s.failed(n, err, panicked)
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

// endAttempt cancels the attempt's context, as net/http does when a handler
// returns, and forgets it.
func (s *Scheduler[K]) endAttempt(bits *atomic.Uint32, done *lazyChan) {
	old := bits.Or(ctxCancelled | ctxEnded)
	if old&ctxWatched != 0 {
		done.close()
		s.core.unwatch(done)
	}
}

// endFirstAttempt is endAttempt for the inline first attempt, whose Done
// channel, if made, lives in the Completion's signals.
func (s *Scheduler[K]) endFirstAttempt(c *Completion) {
	old := c.ctxBits.Or(ctxCancelled | ctxEnded)
	if old&ctxWatched != 0 {
		done := &c.sig.Load().ctxDone
		done.close()
		s.core.unwatch(done)
	}
}

// failed decides what follows a failed attempt. It reports whether n is
// finished (false: n waits for a retry or is parked, holding its key).
func (s *Scheduler[K]) failed(n *node[K], err error, panicked bool) bool {
	c := &n.Completion
	now := time.Now()
	x := c.extra()
	rec := &x.fail
	if rec.errs == nil {
		rec.first = now
	}
	rec.last = now
	rec.errs = append(rec.errs, err)

	// Cancelled (Completion.Cancel) or aborted (Close's context ended) while
	// running: never retried.
	if c.ctxBits.Load()&ctxCancelReq != 0 {
		s.deadLetter(n, err)
		s.core.finish(c, outCancelled, err)
		return true
	}
	if s.core.aborting.Load() {
		s.deadLetter(n, err)
		s.core.finish(c, outAborted, err)
		return true
	}
	retryable := !IsPermanent(err) && (!panicked || s.cfg.retryPanics)
	made := int(x.attempts.Load()) - rec.base
	if retryable && made < s.cfg.retry.MaxAttempts {
		s.core.retried.Add(1)
		// Create the timer stopped, publish it, then publish the state: a
		// Cancel that takes the waiting task finds the timer to stop.
		rec.timer = time.AfterFunc(time.Duration(1<<62), func() { s.requeue(n) })
		c.state.Store(stWaiting)
		rec.timer.Reset(s.cfg.retry.delay(made + 1))
		return false
	}
	if s.cfg.failure == Park {
		// Parked first, then delivered: the dead-letter function already
		// sees the key in Parked, and may Resume or Skip it.
		dl := s.letter(n, err)
		s.park(n)
		s.deliver(dl)
		return false
	}
	s.deadLetter(n, err)
	out := outFailed
	if panicked {
		out = outPanicked
	}
	s.core.finish(c, out, err)
	return true
}

// deadLetter hands a task that failed for good to the dead-letter function,
// or logs it when there is none. No scheduler lock is held.
func (s *Scheduler[K]) deadLetter(n *node[K], err error) {
	s.deliver(s.letter(n, err))
}

// letter describes n, which failed for good with err. It copies what it
// needs, so that it can be delivered after n was parked (and may already be
// running again, resumed).
func (s *Scheduler[K]) letter(n *node[K], err error) DeadLetter[K] {
	c := &n.Completion
	dl := DeadLetter[K]{Key: n.key, Task: c.task, Err: err, Attempts: c.attempts()}
	if x := c.more.Load(); x != nil && x.fail.errs != nil {
		dl.Attempts -= x.fail.base
		dl.Errors = append([]error(nil), x.fail.errs...)
		dl.FirstAttempt, dl.LastAttempt = x.fail.first, x.fail.last
	} else {
		dl.Errors = []error{err}
	}
	return dl
}

func (s *Scheduler[K]) deliver(dl DeadLetter[K]) {
	s.core.deadLettered.Add(1)
	if s.dlq == nil {
		s.cfg.logger.Warn("keysched: task failed", "key", dl.Key, "attempts", dl.Attempts, "err", dl.Err)
		return
	}
	defer func() {
		if r := recover(); r != nil {
			s.cfg.logger.Error("keysched: dead-letter function panicked", "key", dl.Key, "panic", r, "err", dl.Err)
		}
	}()
	s.dlq(dl)
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

// requeue hands a task that waited (a retry timer fired, Resume, or a Cancel
// or abort that took a waiting or parked task) back to a runner.
func (s *Scheduler[K]) requeue(n *node[K]) {
	s.ready.push(n)
	s.workers.kick()
}

// wakeStalled is called when Cancel or Close's abort took a task that was
// waiting for a retry or parked, so its key moves on now.
func (s *Scheduler[K]) wakeStalled(c *Completion, from uint32) {
	n := nodeOf[K](c)
	switch from {
	case stWaiting:
		if c.more.Load().fail.timer.Stop() {
			s.requeue(n)
		} // else the timer fired and requeues it itself
	case stParked:
		s.dropParked(n)
		s.requeue(n)
	}
}

// goexit finishes cur, whose task called runtime.Goexit, and hands on its key
// and the runner slot of the exiting worker.
func (s *Scheduler[K]) goexit(cur *node[K]) {
	if cur != nil && cur.state.Load() == stRunning {
		c := &cur.Completion
		s.core.running.Dec()
		if x := c.more.Load(); x != nil && x.cur.Load() != nil {
			a := x.cur.Load()
			if a.timer != nil {
				a.timer.Stop()
			}
			s.endAttempt(&a.bits, &a.done)
		} else {
			s.endFirstAttempt(c)
		}
		if s.failed(cur, &PanicError{Value: errGoexit, Stack: debug.Stack()}, true) {
			if next := s.advance(cur); next != nil {
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
