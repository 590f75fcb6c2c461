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
	st := s.sched.Stats()
	ej := s.ejectedDL.Load()
	st.Succeeded -= min(ej, st.Succeeded)
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
