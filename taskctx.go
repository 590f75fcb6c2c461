package keysched

import (
	"context"
	"time"
)

// taskContext is the context.Context a task receives. It is one pointer wide,
// so passing it as a context.Context allocates nothing.
//
//   - Values: those of the context given to Submit (through
//     context.WithoutCancel, so Submit's cancellation and deadline are not
//     inherited: a request ending must not cancel the work it handed off).
//   - Cancellation: Completion.Cancel, Close's context ending, the attempt
//     returning, or WithTaskTimeout's deadline (then Err is
//     context.DeadlineExceeded).
type taskContext struct{ a *attemptState }

// taskCtxKey marks a context as a task's: Value(taskCtxKey{}) is its *Completion.
type taskCtxKey struct{}

func (t taskContext) Deadline() (time.Time, bool) {
	if tm := t.a.timer; tm != nil {
		return tm.deadline, true
	}
	return time.Time{}, false
}

func (t taskContext) Done() <-chan struct{} {
	ch, made := t.a.done.get()
	if made {
		// Close's abort must find this channel to close it; register, then
		// look at the flags, so that either the abort sees the registration
		// or this call sees the abort.
		core := t.a.c.core
		core.watch(t.a)
		if t.a.err() != nil {
			t.a.done.close()
		}
	}
	return ch
}

func (t taskContext) Err() error { return t.a.err() }

func (t taskContext) Value(key any) any {
	if key == (taskCtxKey{}) {
		return t.a.c
	}
	return t.a.c.parent.Value(key)
}

func (t taskContext) String() string { return "keysched.taskContext" }

// withValues returns the part of ctx a task keeps: its values, without its
// cancellation. context.Background and context.TODO are kept as they are, so
// the common case allocates nothing.
func withValues(ctx context.Context) context.Context {
	if ctx == context.Background() || ctx == context.TODO() {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// inTask reports whether ctx is, or derives from, the context a keysched task
// received. Such a submission must never wait: the task would be waiting on
// the scheduler it runs on.
func inTask(ctx context.Context) bool {
	_, ok := ctx.Value(taskCtxKey{}).(*Completion)
	return ok
}

// Attempt returns which attempt of its task ctx belongs to: 1 for the first,
// 2 for the first retry, and so on. Outside a task it returns 0. Useful in
// idempotent handlers and logs.
func Attempt(ctx context.Context) int {
	if ctx == nil {
		return 0
	}
	if t, ok := ctx.(taskContext); ok {
		return int(t.a.n)
	}
	c, ok := ctx.Value(taskCtxKey{}).(*Completion)
	if !ok {
		return 0
	}
	return int(c.attempt.Load())
}

// timeoutTimer is an attempt's WithTaskTimeout deadline.
type timeoutTimer struct {
	deadline time.Time
	t        *time.Timer
}
