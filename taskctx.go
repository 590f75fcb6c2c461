package keysched

import (
	"context"
	"sync/atomic"
	"time"
)

// A task's context is one of two types, both one pointer wide so that
// passing them as a context.Context allocates nothing:
//
//   - taskContext, for a task's first attempt (no WithTaskTimeout): its state
//     lives in the Completion itself;
//   - attemptContext, for retries and timed attempts: a fresh attemptState
//     each, so a context handed to an earlier attempt stays cancelled.
//
// Both give the values of the context given to Submit (as
// context.WithoutCancel would: Submit's cancellation and deadline are not
// inherited, a request ending must not cancel the work it handed off), and
// are cancelled by Completion.Cancel, by Close's context ending, when the
// attempt returns, and (attemptContext) at WithTaskTimeout's deadline.
type taskContext struct{ c *Completion }

type attemptContext struct{ a *attemptState }

// attemptState is the context of one attempt other than an untimed first one.
type attemptState struct {
	c        *Completion
	n        int32 // which attempt: 1, 2, ...
	bits     atomic.Uint32
	done     lazyChan
	deadline time.Time   // zero without WithTaskTimeout
	timer    *time.Timer // closes done at the deadline
}

func (a *attemptState) expire() {
	a.bits.Or(ctxTimedOut)
	a.done.close()
}

// taskCtxKey marks a context as a task's: Value(taskCtxKey{}) is its *Completion.
type taskCtxKey struct{}

func (t taskContext) Deadline() (time.Time, bool) { return time.Time{}, false }

func (t taskContext) Done() <-chan struct{} {
	return ctxDone(&t.c.ctxBits, &t.c.signals().ctxDone, t.c)
}

func (t taskContext) Err() error { return ctxErr(t.c.ctxBits.Load(), t.c) }

func (t taskContext) Value(key any) any { return ctxValue(t.c, key) }

func (t taskContext) String() string { return "keysched.taskContext" }

func (t attemptContext) Deadline() (time.Time, bool) {
	return t.a.deadline, !t.a.deadline.IsZero()
}

func (t attemptContext) Done() <-chan struct{} {
	return ctxDone(&t.a.bits, &t.a.done, t.a.c)
}

func (t attemptContext) Err() error { return ctxErr(t.a.bits.Load(), t.a.c) }

func (t attemptContext) Value(key any) any { return ctxValue(t.a.c, key) }

func (t attemptContext) String() string { return "keysched.attemptContext" }

func ctxValue(c *Completion, key any) any {
	switch key {
	case taskCtxKey{}:
		return c
	case cancelCtxKey:
		// As context.WithoutCancel does: the Submit context's cancellation
		// is not the task's (context.Cause and context.WithCancel ask
		// for it with this key).
		return nil
	}
	return c.parent.Value(key)
}

// cancelCtxKey is the key the context package looks up to find a context's
// cancellation (context.Cause asks for it first thing). A task's context
// answers it with nil, as context.WithoutCancel does, which lets the task
// keep the Submit context itself for its values without a wrapper per task.
//
// What it saves, measured (BenchmarkTaskContext: deep-chain no-op tasks
// submitted with a cancellable context, against forcing the fallback to
// context.WithoutCancel; benchstat, n=8, 2026-11-30, 2 shared vCPUs): one
// allocation and 16 bytes per task, and 295 against 363 ns of CPU per task
// (-19%, p=0.05). Were the probe to find no key (a future Go), withValues
// falls back to context.WithoutCancel and TestCancelCtxKeyFound fails.
var cancelCtxKey = func() any {
	var p keyProbe
	_ = context.Cause(&p)
	return p.key
}()

// keyProbe is a context that records the first key asked of it.
type keyProbe struct{ key any }

func (*keyProbe) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*keyProbe) Done() <-chan struct{}       { return nil }
func (*keyProbe) Err() error                  { return context.Canceled }
func (p *keyProbe) Value(key any) any {
	if p.key == nil {
		p.key = key
	}
	return nil
}

// ctxDone makes an attempt's Done channel on first use. Close's abort must be
// able to find it to close it: register it, then look at the flags, so that
// either the abort sees the registration or this call sees the abort.
func ctxDone(bits *atomic.Uint32, done *lazyChan, c *Completion) <-chan struct{} {
	ch, made := done.get()
	if made {
		c.core().watch(bits, done)
		if ctxErr(bits.Load(), c) != nil {
			done.close()
		}
	}
	return ch
}

// withValues returns what a task keeps of its Submit context: the context
// itself, consulted for values only (see ctxValue and cancelCtxKey), so that
// no submission allocates a wrapper. A task's own context is unwrapped to its
// Submit context (same values): a task that resubmits itself with its context
// must not build a chain in which every task keeps all its predecessors. If
// the context package's lookup key could not be found (a future Go), it falls
// back to context.WithoutCancel.
func withValues(ctx context.Context) context.Context {
	switch t := ctx.(type) {
	case taskContext:
		return t.c.parent
	case attemptContext:
		return t.a.c.parent
	case dlContext:
		return t.c.parent
	}
	if cancelCtxKey == nil && ctx != context.Background() && ctx != context.TODO() {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// dlContext is DeadLetter.Context: the task's values, never cancelled, and
// marked as a task's context so that a Submit made with it never waits.
type dlContext struct{ c *Completion }

func (dlContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (dlContext) Done() <-chan struct{}       { return nil }
func (dlContext) Err() error                  { return nil }
func (d dlContext) Value(key any) any         { return ctxValue(d.c, key) }
func (dlContext) String() string              { return "keysched.deadLetterContext" }

// inTask reports whether ctx is, or derives from, the context a keysched task
// received. Such a submission must never wait: the task would be waiting on
// the scheduler it runs on.
func inTask(ctx context.Context) bool {
	switch ctx.(type) {
	case taskContext, attemptContext, dlContext:
		return true
	}
	if ctx == context.Background() {
		return false
	}
	_, ok := ctx.Value(taskCtxKey{}).(*Completion)
	return ok
}

// Attempt returns which attempt of its task ctx belongs to: 1 for the first,
// 2 for the first retry, and so on. Outside a task it returns 0. Useful in
// idempotent handlers and logs.
func Attempt(ctx context.Context) int {
	switch t := ctx.(type) {
	case nil:
		return 0
	case taskContext:
		return 1
	case attemptContext:
		return int(t.a.n)
	}
	c, ok := ctx.Value(taskCtxKey{}).(*Completion)
	if !ok {
		return 0
	}
	return c.attempts()
}
