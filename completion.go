package keysched

import (
	"context"
	"sync/atomic"
)

// Task states. A task moves queued -> running -> done, with waiting (a retry
// backoff) and parked (the Park failure policy) as detours back to running.
// Every transition out of queued, waiting and parked is a CompareAndSwap, so
// exactly one of the runner, Cancel and Close's abort decides each task; the
// winner moves it to stFinishing, writes the outcome, then stores stDone.
const (
	stQueued uint32 = iota
	stRunning
	stWaiting
	stParked
	stFinishing // decided (by Cancel or Close's abort); outcome being written
	stDone
)

// Outcomes, as counted in Stats.
const (
	outSucceeded = iota
	outFailed
	outPanicked
	outCancelled
	outAborted
	numOutcomes
)

// closedChan is the sentinel stored in a lazily made channel slot once the
// event it signals has happened: every later reader gets a closed channel.
var closedChan = func() *chan struct{} { c := make(chan struct{}); close(c); return &c }()

// lazyChan is a channel made only if somebody asks for it, closed exactly once.
type lazyChan struct{ p atomic.Pointer[chan struct{}] }

// get returns the channel, making it if needed. The second result reports
// whether this call made it.
func (l *lazyChan) get() (<-chan struct{}, bool) {
	if p := l.p.Load(); p != nil {
		return *p, false
	}
	c := make(chan struct{})
	if l.p.CompareAndSwap(nil, &c) {
		return c, true
	}
	return *l.p.Load(), false
}

// close closes the channel if it was made, and makes every later get return a
// closed channel. Safe to call more than once and concurrently: the Swap hands
// the made channel to exactly one closer.
func (l *lazyChan) close() {
	if p := l.p.Swap(closedChan); p != nil && p != closedChan {
		close(*p)
	}
}

// A Completion is the handle of one accepted task: it tells when the task
// reached its terminal outcome and what that was. It is the task's queue node
// too, so it costs nothing beyond the task itself; its Done channel is made
// only if somebody asks for it. All methods are safe for concurrent use.
type Completion struct {
	core      *core
	state     atomic.Uint32
	attempt   atomic.Int32 // attempts made so far; the running one included
	cancelReq atomic.Bool  // Cancel was called
	done      lazyChan
	err       error // the outcome; written once before state becomes stDone
	task      Task
	parent    context.Context // values only: see withValues
	first     attemptState    // the first attempt's context, inline
	cur       atomic.Pointer[attemptState]
	fail      *failureRecord // made on the first failed attempt
}

// Done returns a channel closed once the task has reached its terminal
// outcome. The channel is made on the first call.
func (c *Completion) Done() <-chan struct{} {
	ch, _ := c.done.get()
	return ch
}

// Err returns nil until the task is done, then its outcome: nil when it
// succeeded; the error it returned (the last attempt's, with retries); a
// *PanicError when it panicked; context.Canceled when Cancel stopped it before
// it ran; ErrAborted when Close's context ended before it ran.
func (c *Completion) Err() error {
	if c.state.Load() != stDone {
		return nil
	}
	return c.err
}

// Wait blocks until the task is done and returns Err, or returns ctx's error
// if ctx ends first (the task is not affected).
func (c *Completion) Wait(ctx context.Context) error {
	if c.state.Load() == stDone {
		return c.err
	}
	select {
	case <-c.Done():
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Cancel withdraws the task. A task that has not started never runs: it is
// done at once with Err() == context.Canceled (and counted as cancelled), and
// its key goes on with the next task when its turn comes. A task waiting out a
// retry backoff or parked is withdrawn the same way. A running task has its
// context cancelled; its outcome is what it then returns, and it is not
// retried. Cancel on a done task does nothing.
func (c *Completion) Cancel() {
	c.cancelReq.Store(true)
	for {
		switch s := c.state.Load(); s {
		case stQueued:
			if c.state.CompareAndSwap(s, stFinishing) {
				// Still in its chain: the runner that reaches it skips it.
				c.core.finish(c, outCancelled, context.Canceled)
				return
			}
		case stWaiting, stParked:
			if c.state.CompareAndSwap(s, stFinishing) {
				c.core.finish(c, outCancelled, context.Canceled)
				// Its key waits on it: hand it to a runner, which skips it
				// and moves the key on.
				c.core.wakeStalled(c, s)
				return
			}
		case stRunning:
			if a := c.cur.Load(); a != nil {
				a.cancel()
			}
			return
		default:
			return
		}
	}
}

// An attemptState is the context of one attempt of a task. The first attempt's
// lives inside the Completion; retries get a fresh one, so a context handed to
// an earlier attempt stays cancelled.
type attemptState struct {
	c     *Completion
	n     int32 // which attempt: 1, 2, ...
	bits  atomic.Uint32
	done  lazyChan
	timer *timeoutTimer // WithTaskTimeout only
}

const (
	attCancelled uint32 = 1 << iota // Cancel, Close's abort, or the attempt ended
	attTimedOut                     // WithTaskTimeout's deadline passed
	attEnded                        // the attempt returned
	attWatched                      // its Done channel is registered with core.watch
)

func (a *attemptState) cancel() {
	a.bits.Or(attCancelled)
	a.done.close()
}

func (a *attemptState) expire() {
	a.bits.Or(attTimedOut)
	a.done.close()
}

// err is the attempt context's Err.
func (a *attemptState) err() error {
	b := a.bits.Load()
	if b&attTimedOut != 0 {
		return context.DeadlineExceeded
	}
	if b&attCancelled != 0 || a.c.cancelReq.Load() || a.c.core.aborting.Load() {
		return context.Canceled
	}
	return nil
}
