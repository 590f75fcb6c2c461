package keysched

import (
	"context"
	"sync/atomic"
)

// Task states. A task moves queued -> running -> decided -> done, with
// waiting (a retry backoff) and parked (the Park failure policy) as detours
// back to running. Every transition out of queued, waiting and parked is a
// CompareAndSwap, so exactly one of the runner, Cancel and Close's abort
// decides each task; the winner moves it to stFinishing, writes the outcome
// and counts it, then stores stDecided: from then on its key may move past
// it. It becomes stDone (its Completion done) by publish, once its dead
// letters, if any, were delivered (see core.publish).
const (
	stQueued uint32 = iota
	stRunning
	stWaiting
	stParked
	stFinishing // taken (by Cancel or Close's abort); outcome being written
	stDecided   // outcome written and counted; Completion not yet done
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

// Context flags of an attempt (Completion.ctxBits for the first attempt,
// attemptState.bits for the others).
const (
	ctxCancelled uint32 = 1 << iota // Cancel, Close's abort, or the attempt returned
	ctxTimedOut                     // WithTaskTimeout's deadline passed
	ctxEnded                        // the attempt returned
	ctxWatched                      // its Done channel is registered with core.watch
	ctxCancelReq                    // Completion only: Cancel was called
	ctxStarted                      // Completion only: the first attempt started
	ctxPubReq                       // Completion only: decided while a dead letter was being delivered
	ctxPassHold                     // Completion only: aborted in its chain; done once passed (see core.passedOn)
)

// dlUnit counts, in a Completion's ctxBits above the flags, the dead letters
// of its task being delivered: the task is not done before they were (see
// core.publish).
const (
	dlUnit  uint32 = 1 << 16
	dlCount        = ^(dlUnit - 1)
)

// A Completion is the handle of one accepted task: it tells when the task
// reached its terminal outcome and what that was. It is the task's queue node
// too, so it costs nothing beyond the task itself; its Done channel is made
// only if somebody asks for it. All methods are safe for concurrent use.
//
// Keeping a Completion keeps its task's outcome and the context it was
// submitted with (for its values), not its task: the function and the key's
// later tasks are let go once it finishes.
type Completion struct {
	hdr     *chainHdr // its key's chain header; hdr.core is the scheduler's
	state   atomic.Uint32
	ctxBits atomic.Uint32 // the first attempt's context flags, and ctxCancelReq
	sig     atomic.Pointer[signals]
	task    Task
	parent  context.Context // values only: see withValues
	more    atomic.Pointer[taskExtra]
}

// signals holds the channels a Completion makes only when asked: Done, and
// the first attempt's context's Done. Most tasks never need either.
type signals struct {
	done    lazyChan // closed when the task is done
	ctxDone lazyChan // the first attempt's context's Done
}

func (c *Completion) signals() *signals {
	if g := c.sig.Load(); g != nil {
		return g
	}
	g := new(signals)
	if c.sig.CompareAndSwap(nil, g) {
		return g
	}
	return c.sig.Load()
}

// taskExtra holds what only retried or timed tasks need, made on demand so
// the common task stays small.
type taskExtra struct {
	err      error                        // the outcome, when not nil; written before state becomes stDone
	attempts atomic.Int32                 // attempts started, when > 1 or timed
	cur      atomic.Pointer[attemptState] // the running attempt's context, when not the inline one
	fail     failureRecord
	waiting  atomic.Pointer[waitRec] // a Wait made with the task's context, in progress (deadlock.go)
	// aborted is the DeadLetter[K] of a task Close's abort took while it was
	// still on its chain, written before it is decided: whoever passes it on
	// its key hands it to the key's lane (Scheduler.laneAborted, close.go).
	aborted any
}

// extra returns the task's extra part, making it. Its owner (its runner, or
// whoever moved it to stFinishing) writes the failure record and outcome;
// waits made with the task's context only use taskExtra.waiting.
func (c *Completion) extra() *taskExtra {
	if x := c.more.Load(); x != nil {
		return x
	}
	x := new(taskExtra)
	if c.ctxBits.Load()&ctxStarted != 0 {
		x.attempts.Store(1)
	}
	// A task's own goroutines may make it too (Wait with the task's
	// context registers the wait here): one of them wins.
	if c.more.CompareAndSwap(nil, x) {
		return x
	}
	return c.more.Load()
}

// attempts returns how many attempts of the task have started.
func (c *Completion) attempts() int {
	if x := c.more.Load(); x != nil {
		return int(x.attempts.Load())
	}
	if c.ctxBits.Load()&ctxStarted != 0 {
		return 1
	}
	return 0
}

func (c *Completion) core() *core { return c.hdr.core }

// Done returns a channel closed once the task has reached its terminal
// outcome. By then Stats counts that outcome, and the task's dead letter, if
// it has one, was delivered (see WithDeadLetter). The channel is made on the
// first call. A task that receives from it to wait for another task is not
// checked for a deadlock (see ErrDeadlock): use Wait with the task's context.
// A nil *Completion (what Submit returns with an error) is done: its channel
// is closed, and Err and Wait return ErrNilCompletion. So is a zero
// Completion (one no scheduler returned): it is no task.
func (c *Completion) Done() <-chan struct{} {
	if c == nil {
		return *closedChan
	}
	g := c.signals()
	ch, made := g.done.get()
	if made && (c.state.Load() == stDone || c.hdr == nil) {
		// finish may have looked for the channel before it existed; a
		// zero Completion never finishes.
		g.done.close()
	}
	return ch
}

// Err returns nil until the task is done, then its outcome: nil when it
// succeeded; the error it returned (the last attempt's, with retries); a
// *PanicError when it panicked; context.Canceled when Cancel withdrew it
// before it ran; ErrAborted when Close's context ended before it ran (an
// error matching ErrAborted, saying so, when it had run: parked, or waiting
// to run again). On a nil or zero Completion it is ErrNilCompletion.
func (c *Completion) Err() error {
	if c == nil {
		return ErrNilCompletion
	}
	if c.state.Load() != stDone {
		if c.hdr == nil {
			return ErrNilCompletion // a zero Completion: no task
		}
		return nil
	}
	if x := c.more.Load(); x != nil {
		return x.err
	}
	return nil
}

// Wait blocks until the task is done and returns Err, or returns ctx's error
// if ctx ends first (the task is not affected). A nil ctx gets ErrNilContext.
// A nil or zero Completion (no scheduler returned it) gets ErrNilCompletion
// at once.
//
// Called with the context of a running task (or one derived from it), Wait
// fails at once with an error wrapping ErrDeadlock when the wait could never
// end: c is that task itself or a later task of its own key, or the wait
// closes a cycle of waits (task A waits for a task queued behind task B on
// another key, B waits for one behind A; longer cycles too, across
// schedulers). See ErrDeadlock for what is and is not detected.
//
// Only the context says that the caller is a task (Go has no goroutine
// identity to recognise the calling task by): a task that calls Wait with
// another context (context.Background(), or one of its own not derived from
// the task's) on itself or a later task of its own key blocks for ever,
// without an error, until that context ends. Inside a task, always pass the
// task's context.
func (c *Completion) Wait(ctx context.Context) error {
	if c == nil {
		return ErrNilCompletion
	}
	if c.state.Load() == stDone {
		return c.Err()
	}
	if c.hdr == nil {
		return ErrNilCompletion // a zero Completion: no task, never done
	}
	if ctx == nil {
		return ErrNilContext
	}
	if t := waiterTask(ctx); t != nil {
		return c.waitAsTask(ctx, t)
	}
	select {
	case <-c.Done():
		return c.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Cancel withdraws the task. A task that has not started never runs: it is
// done at once with Err() == context.Canceled (and counted as cancelled), and
// its key goes on with the next task when its turn comes. A task waiting out a
// retry backoff or parked is withdrawn the same way. A running task has its
// context cancelled; its outcome is what it then returns, and it is not
// retried. Cancel on a done task does nothing, nor on a Completion no
// scheduler returned (the zero value, or nil).
func (c *Completion) Cancel() {
	if c == nil || c.hdr == nil {
		return // not a task: nothing to withdraw (and no scheduler to tell)
	}
	c.ctxBits.Or(ctxCancelReq)
	for {
		switch s := c.state.Load(); s {
		case stQueued:
			if c.state.CompareAndSwap(s, stFinishing) {
				// Still in its chain: the runner that reaches it skips it.
				c.core().finish(c, outCancelled, context.Canceled)
				return
			}
		case stWaiting, stParked:
			if c.state.CompareAndSwap(s, stFinishing) {
				c.core().finish(c, outCancelled, context.Canceled)
				// Its key waits on it: hand it to a runner, which skips it
				// and moves the key on.
				c.core().wakeStalled(c, s)
				return
			}
		case stRunning:
			if x := c.more.Load(); x != nil {
				if a := x.cur.Load(); a != nil {
					cancelCtx(&a.bits, &a.done)
				}
			}
			c.ctxBits.Or(ctxCancelled)
			if g := c.sig.Load(); g != nil {
				g.ctxDone.close()
			}
			return
		default:
			return
		}
	}
}

// cancelCtx cancels an attempt's context.
func cancelCtx(bits *atomic.Uint32, done *lazyChan) {
	bits.Or(ctxCancelled)
	done.close()
}

// ctxErr is an attempt context's Err, from its flags, the task's Cancel and
// the scheduler's abort.
func ctxErr(bits uint32, c *Completion) error {
	if bits&ctxTimedOut != 0 {
		return context.DeadlineExceeded
	}
	if bits&ctxCancelled != 0 || c.ctxBits.Load()&ctxCancelReq != 0 || c.core().aborting.Load() {
		return context.Canceled
	}
	return nil
}
