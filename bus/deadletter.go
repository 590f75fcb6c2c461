package bus

import (
	"context"
	"errors"
	"time"

	"github.com/keysched/keysched"
)

// This file holds dead letters: the bus's DeadLetter, and how the
// scheduler's dead letters get back to their envelopes.

// A DeadLetter describes an event that a subscriber failed for good. It
// carries the original envelope (payload, ID, headers) for a deliberate
// replay with PublishEnvelope.
type DeadLetter[K comparable] struct {
	Subscriber string
	Envelope   Envelope[K]
	// Attempts is how many attempts the handler made for the event (since
	// the last Resume, for a parked key); 0 for an event that never ran
	// (Close aborted it, or the subscriber was ejected first). A run whose
	// handler returned keysched.Snooze is not an attempt: it is not counted.
	Attempts int
	// Err is the last attempt's error, or the reason the event never ran:
	// ErrEjected, keysched.ErrAborted. A panic is a *keysched.PanicError.
	Err error
	// FirstAttempt and LastAttempt are when the first and the last failed
	// attempts ended; zero when the handler never ran for the event, and for
	// an ejected event (whose earlier attempts, if any, are not timed).
	FirstAttempt, LastAttempt time.Time
	// Context carries the values of the context the event was published
	// with; it is never cancelled. It counts as a handler's context: Close,
	// Drain and Unsubscribe called with it return keysched.ErrInsideTask at
	// once, and a Publish made with it never waits for room. The dead-letter
	// function must not call them with any other context: they would wait
	// for the dead letter being delivered, that is for the function itself
	// (Close(context.Background()) from it hung for ever).
	Context context.Context
}

// dlCtxKey marks DeadLetter.Context, so that the bus recognises it even for
// an event that never ran (keysched.Attempt is then 0).
type dlCtxKey struct{}

// dlContext makes a DeadLetter.Context from the scheduler's (or the
// attempt's, without its cancellation).
func dlContext(parent context.Context) context.Context {
	if parent == nil {
		parent = context.Background()
	}
	return context.WithValue(parent, dlCtxKey{}, true)
}

// insideHandler reports whether ctx is a handler's or a dead-letter
// function's: a call that waits for the bus's events must not be made
// with it.
func insideHandler(ctx context.Context) bool {
	return keysched.Attempt(ctx) > 0 || ctx.Value(dlCtxKey{}) != nil
}

// envProbe is a context that makes a subscriber's task report its envelope
// instead of running: how a keysched dead letter, which carries the task,
// gets back to the event.
type envProbe[K comparable] struct {
	context.Context
	env Envelope[K]
	ok  bool
}

// onDeadLetter receives the scheduler's dead letters and hands them on with
// the envelope.
func (s *sub[K]) onDeadLetter(kdl keysched.DeadLetter[K]) {
	dl := DeadLetter[K]{
		Subscriber:   s.name,
		Attempts:     kdl.Attempts,
		Err:          kdl.Err,
		FirstAttempt: kdl.FirstAttempt,
		LastAttempt:  kdl.LastAttempt,
	}
	dl.Envelope.Key = kdl.Key
	dl.Context = dlContext(kdl.Context)
	if kdl.Task != nil {
		p := envProbe[K]{Context: context.Background()}
		_ = kdl.Task(&p)
		if p.ok {
			dl.Envelope = p.env
		}
	}
	if s.parking != nil && !errors.Is(kdl.Err, keysched.ErrAborted) {
		s.willPark(kdl.Key)
	}
	s.deadLetter(dl)
}

// deadLetter hands dl to the subscriber's function, or logs it.
func (s *sub[K]) deadLetter(dl DeadLetter[K]) {
	if s.dl == nil {
		s.bus.logger.Warn("bus: event dead-lettered", "subscriber", s.name, "key", dl.Envelope.Key,
			"id", dl.Envelope.ID, "attempts", dl.Attempts, "err", dl.Err)
		return
	}
	defer func() {
		if r := recover(); r != nil {
			s.bus.logger.Error("bus: dead-letter function panicked", "subscriber", s.name,
				"key", dl.Envelope.Key, "id", dl.Envelope.ID, "panic", r, "err", dl.Err)
		}
	}()
	s.dl(dl)
}
