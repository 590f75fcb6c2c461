package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/keysched/keysched"
)

// This file holds ejection (EjectAfter): counting timed-out attempts,
// ejecting, and releasing an ejected subscriber's parked keys.

// runWatched runs the handler and counts consecutive timed-out attempts.
func (s *sub[K]) runWatched(ctx context.Context, env Envelope[K]) error {
	returned := false
	defer func() {
		if !returned {
			s.timeouts.Store(0) // a panic is not a timeout: it breaks the streak
		}
	}()
	err := s.invoke(ctx, env)
	returned = true
	if err == nil {
		s.delivered.Add(1)
	}
	timedOut := ctx.Err() == context.DeadlineExceeded ||
		(err != nil && errors.Is(err, context.DeadlineExceeded))
	if !timedOut {
		s.timeouts.Store(0)
	} else if n := s.timeouts.Add(1); n >= int64(s.cfg.ejectAfter) {
		s.eject(n)
	}
	if err != nil && s.ejected.Load() {
		// The subscriber is gone: no retry.
		return keysched.Permanent(fmt.Errorf("%w: %w", ErrEjected, err))
	}
	return err
}

// eject makes the subscriber's ejection final and visible.
func (s *sub[K]) eject(n int64) {
	if !s.ejected.CompareAndSwap(false, true) {
		return
	}
	s.bus.logger.Warn("bus: subscriber ejected after consecutive timed-out attempts",
		"subscriber", s.name, "timeouts", n, "timeout", s.cfg.timeout)
	if s.parking != nil {
		s.parkMu.Lock()
		start := s.startReleaseLocked()
		s.parkMu.Unlock()
		if start {
			go s.releaseParked()
		}
	}
}

// willPark records that key parked (Failure(Park)): the scheduler parks a
// key's head, then dead-letters it.
func (s *sub[K]) willPark(key K) {
	s.parkMu.Lock()
	s.parking[key] = struct{}{}
	start := s.ejected.Load() && s.startReleaseLocked()
	s.parkMu.Unlock()
	if start {
		go s.releaseParked()
	}
}

// startReleaseLocked reports whether the caller must start releaseParked,
// and registers it with the bus. Called with parkMu held.
func (s *sub[K]) startReleaseLocked() bool {
	if s.releasing || len(s.parking) == 0 {
		return false
	}
	select {
	case <-s.done:
		return false // closed: Close no longer waits for helpers
	default:
	}
	s.releasing = true
	s.bus.helpers.Add(1)
	return true
}

// releaseParked skips the parked keys of an ejected subscriber, so that the
// events queued behind them are dead-lettered with ErrEjected. A recorded key
// is parked already (the scheduler parks before it dead-letters), but a
// concurrent Resume may have taken it and it may park again: so it looks
// again, backing off, until every recorded key has been skipped or the
// subscriber is closed. Ejection with Park is rare; this costs nothing
// otherwise.
func (s *sub[K]) releaseParked() {
	defer s.bus.helpers.Done()
	delay := 50 * time.Microsecond
	for {
		for _, k := range s.sched.Parked() {
			if s.sched.Skip(k) == nil {
				s.parkMu.Lock()
				delete(s.parking, k)
				s.parkMu.Unlock()
			}
		}
		s.parkMu.Lock()
		if len(s.parking) == 0 {
			s.releasing = false
			s.parkMu.Unlock()
			return
		}
		s.parkMu.Unlock()
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-s.done:
			t.Stop()
			s.parkMu.Lock()
			s.releasing = false
			s.parkMu.Unlock()
			return
		}
		delay = min(2*delay, 10*time.Millisecond)
	}
}
