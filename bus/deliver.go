package bus

import (
	"context"
	"errors"
	"fmt"

	"github.com/keysched/keysched"
)

// This file holds the per-event path: offering an event to a subscriber's
// scheduler (Publish's side) and running the handler (the worker's side).

// offer hands env to the subscriber's scheduler, waiting for room if wait is
// set (and ctx is not a handler's). An unsubscribed or ejected subscriber
// takes nothing and reports no error.
func (s *sub[K]) offer(ctx context.Context, env Envelope[K], wait bool) (taken bool, err error) {
	if s.gone.Load() {
		return false, nil
	}
	if s.ejected.Load() {
		s.skipped.Add(1)
		return false, nil
	}
	// One allocation: the closure holds the subscriber and its own copy of
	// the envelope (the Headers map and the Event are shared).
	task := func(ctx context.Context) error { return s.run(ctx, env) }
	if wait {
		_, err = s.sched.Submit(ctx, env.Key, task)
	} else {
		_, err = s.sched.TrySubmit(ctx, env.Key, task)
	}
	if err == nil {
		s.bus.accepted.Add(1)
	}
	return err == nil, err
}

// refusal turns a scheduler's refusal into the reason Publish reports, and
// counts it; nil means there is nothing to report.
func (s *sub[K]) refusal(err error) error {
	full := errors.Is(err, keysched.ErrKeyFull) || errors.Is(err, keysched.ErrFull)
	switch {
	case errors.Is(err, keysched.ErrClosed):
		if s.gone.Load() {
			return nil // unsubscribed while the event was offered
		}
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	case full && s.cfg.overflow == DropNewest:
		s.dropped.Add(1)
		return fmt.Errorf("%w: %w", ErrDropped, err)
	}
	s.refused.Add(1)
	return err
}

// run is the task the subscriber's scheduler runs for one event.
func (s *sub[K]) run(ctx context.Context, env Envelope[K]) error {
	if p, ok := ctx.(*envProbe[K]); ok {
		p.env, p.ok = env, true
		return nil
	}
	if s.ejected.Load() {
		// Completed here, not by the scheduler: an error would be retried or
		// park the key. SubStats moves it from Succeeded to Failed.
		s.ejectedDL.Add(1)
		s.deadLetter(DeadLetter[K]{
			Subscriber: s.name,
			Envelope:   env,
			Attempts:   keysched.Attempt(ctx) - 1,
			Err:        ErrEjected,
			Context:    dlContext(context.WithoutCancel(ctx)),
		})
		return nil
	}
	if s.cfg.ejectAfter == 0 {
		err := s.invoke(ctx, env)
		if err == nil {
			s.delivered.Add(1)
		}
		return err
	}
	return s.runWatched(ctx, env)
}
