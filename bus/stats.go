package bus

import "github.com/keysched/keysched"

// This file holds a subscriber's counters (SubStats).

// SubStats is a snapshot of a subscriber's counters: its scheduler's
// keysched.Stats, adjusted, plus the bus's own. Fields are read one by one
// while events run, so they agree only when the bus is idle.
//
// In the embedded Stats: Submitted counts accepted events; events
// dead-lettered with ErrEjected count as Failed and DeadLettered (not as
// Succeeded); Rejected counts the events this subscriber refused in Publish
// (Dropped excluded).
type SubStats struct {
	keysched.Stats
	// Delivered counts events whose handler returned nil.
	Delivered uint64
	// Dropped counts events dropped by OnFull(DropNewest).
	Dropped uint64
	// Skipped counts events not offered because the subscriber was ejected.
	Skipped uint64
	// Ejected reports whether EjectAfter ejected the subscriber.
	Ejected bool
	// EjectedEvents counts events dead-lettered with ErrEjected without the
	// handler running.
	EjectedEvents uint64
}

func (s *sub[K]) stats() SubStats {
	// The scheduler's counters first, then ejectedDL: an ejected event is
	// counted in ejectedDL before its task returns nil and the scheduler
	// counts it as succeeded, so in that order Succeeded minus ejectedDL is
	// never above the true count; it is below it while such an event's dead
	// letter is being delivered. succeededFloor keeps the figure from going
	// back then (a Counter that decreases reads as a reset to a metrics
	// backend).
	st := s.sched.Stats()
	ej := s.ejectedDL.Load()
	st.Succeeded = s.raiseSucceeded(st.Succeeded - min(ej, st.Succeeded))
	st.Failed += ej
	st.DeadLettered += ej
	st.Rejected = s.refused.Load()
	return SubStats{
		Stats:         st,
		Delivered:     s.delivered.Load(),
		Dropped:       s.dropped.Load(),
		Skipped:       s.skipped.Load(),
		Ejected:       s.ejected.Load(),
		EjectedEvents: ej,
	}
}

// raiseSucceeded returns the larger of v and the largest Succeeded reported
// so far, and records it.
func (s *sub[K]) raiseSucceeded(v uint64) uint64 {
	for {
		f := s.succeededFloor.Load()
		if v <= f {
			return f
		}
		if s.succeededFloor.CompareAndSwap(f, v) {
			return v
		}
	}
}
