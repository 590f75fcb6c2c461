package bus

import (
	"context"
	"fmt"

	"github.com/keysched/keysched"
)

// This file holds the Subscription handle: naming, draining, unsubscribing
// and closing a subscriber, and its parked keys.

// A Subscription is a subscriber registered on a bus: a name, a handler and
// its own scheduler (its own order, bounds and counters) on the bus's pool.
// Its key type K is the bus's, so Parked, Resume and Skip are checked by the
// compiler. All methods are safe for concurrent use. The zero Subscription
// is not usable (Subscribe returns one): on a nil or zero Subscription,
// methods return ErrZeroSubscription or zero values.
type Subscription[K comparable] struct {
	s *sub[K]
}

// Name returns the subscriber's name, unique on its bus.
func (s *Subscription[K]) Name() string {
	if s.zero() {
		return ""
	}
	return s.s.name
}

// Unsubscribe removes the subscriber: from the moment it starts, Publish no
// longer offers it events (an event being offered concurrently may or may
// not be accepted). Then it waits until the events it accepted are handled
// and closes its scheduler. If ctx ends first, the running handlers' contexts
// are cancelled and the events that did not run are dead-lettered with
// keysched.ErrAborted; it returns an error wrapping keysched.ErrAborted and
// ctx's error; handlers still running and dead letters not yet delivered go
// on in the background, and Bus.Drain and Bus.Close wait for them.
// Idempotent: later calls wait for the first one's result (or their own ctx:
// then an error naming the subscriber, wrapping ctx's). With
// a handler's context (or a DeadLetter's Context) it returns
// keysched.ErrInsideTask and does nothing.
func (s *Subscription[K]) Unsubscribe(ctx context.Context) error {
	if s.zero() {
		return ErrZeroSubscription
	}
	return s.s.unsubscribe(ctx)
}

// Drain waits until every event this subscriber accepted so far has been
// handled or dead-lettered, or until ctx ends (then the error wraps ctx's).
// Parked keys hold their events. With a handler's context (or a DeadLetter's Context) it returns
// keysched.ErrInsideTask.
func (s *Subscription[K]) Drain(ctx context.Context) error {
	if s.zero() {
		return ErrZeroSubscription
	}
	return s.s.drain(ctx)
}

// Stats returns a snapshot of the subscriber's counters.
func (s *Subscription[K]) Stats() SubStats {
	if s.zero() {
		return SubStats{}
	}
	return s.s.stats()
}

// Parked returns the keys now parked for this subscriber (Failure(Park)), in
// no order.
func (s *Subscription[K]) Parked() []K {
	if s.zero() {
		return nil
	}
	return s.s.sched.Parked()
}

// Resume runs a parked key's head event again for this subscriber, with a
// fresh attempt budget; if it then succeeds the key goes on. It returns
// keysched.ErrNotParked for a key that is not parked, keysched.ErrInvalidKey
// (wrapped) for a key unusable as a map key (a NaN, an interface holding a
// slice), and keysched.ErrClosed once the subscriber's Close or Unsubscribe
// has given up on unfinished events.
func (s *Subscription[K]) Resume(key K) error {
	if s.zero() {
		return ErrZeroSubscription
	}
	return s.s.resume(key)
}

// Skip gives up a parked key's head event (it was dead-lettered when the key
// parked) and moves the key on to its next event, for this subscriber.
// Errors as for Resume.
func (s *Subscription[K]) Skip(key K) error {
	if s.zero() {
		return ErrZeroSubscription
	}
	return s.s.skip(key)
}

func (s *sub[K]) unsubscribe(ctx context.Context) error {
	if ctx == nil {
		return keysched.ErrNilContext
	}
	if insideHandler(ctx) {
		return fmt.Errorf("bus: unsubscribe %q: %w", s.name, keysched.ErrInsideTask)
	}
	b := s.bus
	b.mu.Lock()
	if !s.gone.Load() {
		s.gone.Store(true)
		if b.names[s.name] == s {
			delete(b.names, s.name)
			b.setRoutes()
		}
	}
	b.mu.Unlock()
	return s.shutdown(ctx)
}

// shutdown closes the subscriber's scheduler (idempotent: later calls wait
// for the first one's result, or their ctx: then an error naming the
// subscriber, wrapping ctx's).
func (s *sub[K]) shutdown(ctx context.Context) error {
	first := false
	s.closeOnce.Do(func() { first = true })
	if !first {
		select {
		case <-s.done:
			return s.closeErr
		case <-ctx.Done():
			select {
			case <-s.done:
				return s.closeErr
			default:
			}
			return fmt.Errorf("subscriber %q: another Unsubscribe or Close is still closing it, waiting for its events: %w", s.name, ctx.Err())
		}
	}
	err := s.sched.Close(ctx)
	if err != nil {
		err = fmt.Errorf("subscriber %q: %w", s.name, err)
	}
	s.closeErr = err
	s.parkMu.Lock()
	close(s.done)
	s.parkMu.Unlock()
	b := s.bus
	b.mu.Lock()
	delete(b.live, s)
	if err != nil {
		b.lingering[s] = struct{}{} // Drain waits for what it left running
	}
	b.mu.Unlock()
	return err
}

func (s *sub[K]) drain(ctx context.Context) error {
	if ctx == nil {
		return keysched.ErrNilContext
	}
	if err := s.sched.Drain(ctx); err != nil {
		return fmt.Errorf("bus: drain %q: %w", s.name, err)
	}
	return nil
}

func (s *sub[K]) resume(k K) error {
	if err := s.sched.Resume(k); err != nil {
		return err
	}
	s.unparked(k)
	return nil
}

func (s *sub[K]) skip(k K) error {
	if err := s.sched.Skip(k); err != nil {
		return err
	}
	s.unparked(k)
	return nil
}

func (s *sub[K]) unparked(k K) {
	if s.parking == nil {
		return
	}
	s.parkMu.Lock()
	delete(s.parking, k)
	s.parkMu.Unlock()
}

// zero reports a nil or zero-value Subscription (not returned by Subscribe).
func (s *Subscription[K]) zero() bool { return s == nil || s.s == nil }
