package bus

import (
	"time"

	"github.com/keysched/keysched"
)

// This file holds what operators look at per subscriber: its scheduler's
// observer hook, task ages and per-key inspection (see keysched's).

// Observe sets o on the subscriber's scheduler (keysched.WithObserver): its
// functions see each event of this subscriber as a task (accepted, attempt
// started and ended, dead-lettered), with monotonic timestamps. It implies
// TaskAges. o's key type must be the bus's, or Subscribe fails with an error
// wrapping keysched.ErrInvalidOption. Observer functions run on the hot
// path: see keysched.Observer.
func Observe[K comparable](o keysched.Observer[K]) SubOption {
	return func(c *subConfig) error {
		c.sched = append(c.sched, keysched.WithObserver(o))
		return nil
	}
}

// TaskAges stamps each event the subscriber accepts with the time (one
// monotonic clock read), so that OldestAge and Keys report how long the
// oldest unhandled events have waited (keysched.WithTaskAges).
func TaskAges() SubOption {
	return func(c *subConfig) error {
		c.sched = append(c.sched, keysched.WithTaskAges())
		return nil
	}
}

// OldestAge returns how long ago the subscriber's oldest unhandled event
// (queued, running, retrying or parked) was accepted, or 0 when none is, and
// without TaskAges or Observe. It walks the subscriber's live keys: see
// keysched.Scheduler.OldestAge.
func (s *Subscription[K]) OldestAge() time.Duration {
	if s.zero() {
		return 0
	}
	return s.s.sched.OldestAge()
}

// Keys returns up to n of the subscriber's live keys, those with the most
// events first, each with its depth, whether it is parked and its head's age
// (see keysched.Scheduler.Keys: same cost). n <= 0 returns every live key.
func (s *Subscription[K]) Keys(n int) []keysched.KeyInfo[K] {
	if s.zero() {
		return nil
	}
	return s.s.sched.Keys(n)
}
