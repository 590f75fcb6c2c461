package keysched

import (
	"context"
	"fmt"
)

// This file finds waits that can never end (ErrDeadlock): a task waiting,
// with its own context, for itself, a later task of its own key, or a task
// whose key's running head waits, directly or through other keys, for a task
// behind the waiter.
//
// The wait-for graph is implicit. A task T that waits with its context
// registers a waitRec (the waited Completion) in its taskExtra for as long as
// the wait lasts. A Completion N that is not done can run only after the
// task at the head of N's chain; if that head is running and itself waits
// (its waitRec), N waits on what that head waits on, and so on. T's wait
// closes a cycle when this walk from the waited task reaches T's own chain:
// T holds it (T is running at its head), so everything on it waits for T.
//
// Nothing is locked: the walk reads heads, states and waitRecs that move
// while it walks. A cycle is reported only if a second pass finds every
// edge unchanged: each waitRec is a fresh object per Wait, registered once
// and unregistered once, so a waitRec seen in both passes was in place the
// whole time between; all edges were then present at one instant, and since
// every task on the cycle is blocked in a wait on the next, the cycle is real.

// maxWaitWalk bounds the walk: a longer chain of waits is not examined (no
// error; such a cycle is not detected).
const maxWaitWalk = 1 << 16

// waitRec is one Wait in progress, made with the context of the task that
// waits.
type waitRec struct{ target *Completion }

// waiterTask returns the task whose context ctx is (or derives from), or nil.
// A DeadLetter.Context counts as its task's.
func waiterTask(ctx context.Context) *Completion {
	switch t := ctx.(type) {
	case taskContext:
		return t.c
	case attemptContext:
		return t.a.c
	case dlContext:
		return t.c
	}
	if ctx == context.Background() || ctx == context.TODO() {
		return nil
	}
	c, _ := ctx.Value(taskCtxKey{}).(*Completion)
	return c
}

// waitAsTask is Wait for c, not done, with the context of task t.
func (c *Completion) waitAsTask(ctx context.Context, t *Completion) error {
	// t holds its key, so it can deadlock (c.hdr is nil only for a
	// Completion no scheduler returned: no chain to walk).
	if t.state.Load() == stRunning && c.hdr != nil {
		if c.hdr == t.hdr && !doneOffChain(c) {
			// c is t, or behind t on its key (t runs at the head; c is not
			// done, so it is still on the chain), and it is done only once
			// its key has passed it.
			return fmt.Errorf("%w: a task waits for itself or for a later task of its own key", ErrDeadlock)
		}
		rec := &waitRec{target: c}
		x := t.extra()
		// One registered wait per task: a second concurrent Wait of the
		// same task (from a goroutine of its own) is not registered, only
		// checked.
		registered := x.waiting.CompareAndSwap(nil, rec)
		if n := closesCycle(t, c); n > 0 {
			if registered {
				x.waiting.CompareAndSwap(rec, nil)
			}
			return fmt.Errorf("%w: the wait closes a cycle of waits through %d keys", ErrDeadlock, n+1)
		}
		if registered {
			defer x.waiting.CompareAndSwap(rec, nil)
		}
	}
	select {
	case <-c.Done():
		return c.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitEdge is one step of the walk: head, running at the front of the chain
// of a task the walk reached, waits for rec.target.
type waitEdge struct {
	from *Completion // the task reached (not done)
	head *Completion
	rec  *waitRec
}

// closesCycle reports whether t, running at the head of its key, waiting for
// c closes a cycle of waits; if so it returns the number of other keys on the
// cycle (> 0), else 0.
func closesCycle(t, c *Completion) int {
	var path []waitEdge
	cur := c
	for range maxWaitWalk {
		if doneOffChain(cur) {
			return 0 // finished, or finishing without its key moving on
		}
		if cur.hdr == t.hdr {
			if validCycle(path, cur) {
				return len(path)
			}
			return 0
		}
		h := cur.hdr.head.Load()
		if h == nil || h.state.Load() != stRunning {
			return 0 // queued, in a backoff, parked or finishing: not waiting on us
		}
		x := h.more.Load()
		if x == nil {
			return 0
		}
		r := x.waiting.Load()
		if r == nil {
			return 0 // running, not waiting (or waiting in a way we cannot see)
		}
		path = append(path, waitEdge{from: cur, head: h, rec: r})
		cur = r.target
	}
	return 0
}

// validCycle reads every edge of path again (see the file comment): the
// cycle is real only if each reached task is still unfinished, each head
// still running and still in the very same wait. last is the task on the
// waiter's own chain the walk ended at.
func validCycle(path []waitEdge, last *Completion) bool {
	for _, e := range path {
		if doneOffChain(e.from) || e.head.state.Load() != stRunning {
			return false
		}
		if x := e.head.more.Load(); x == nil || x.waiting.Load() != e.rec {
			return false
		}
	}
	return !doneOffChain(last)
}

// doneOffChain reports whether c is done, or will be without its key moving
// on: taken by Cancel (done at once) or decided by its runner. A task that
// Close's abort took while it was still on its chain is decided but held
// until its key passes it (ctxPassHold): it waits for its key's head like a
// queued task. (In the instant between the abort's CompareAndSwap and its
// hold, a task counts as done off its chain.)
func doneOffChain(c *Completion) bool {
	switch c.state.Load() {
	case stDone:
		return true
	case stFinishing, stDecided:
		return c.ctxBits.Load()&ctxPassHold == 0
	}
	return false
}
