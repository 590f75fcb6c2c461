package keysched

// Stats is a snapshot of a scheduler's state and counters. The fields are
// read one by one while tasks run, so they agree with each other only when
// the scheduler is idle: after Drain or Close returns,
// Submitted == Succeeded + Failed + Panicked + Cancelled + Aborted,
// Pending == 0 and Keys == 0. A task's outcome is counted before its
// Completion is done. When Close gave up and returned while tasks still ran,
// each of them (and the aborted tasks queued behind it on its key) stops
// counting in Pending and Keys before its Completion is done: once every
// Completion is done, Stats is settled.
type Stats struct {
	Keys    int // keys with queued or running tasks now
	Pending int // accepted tasks not yet finished (and not yet passed by their key), plus dead letters being delivered
	Running int // tasks running now
	// ParkedKeys is the number of keys parked now (FailurePolicy Park).
	ParkedKeys int

	Submitted uint64 // tasks accepted since New
	Succeeded uint64 // tasks that returned nil
	Failed    uint64 // tasks that failed for good (dead-lettered, or skipped)
	Panicked  uint64 // tasks whose last attempt panicked
	Cancelled uint64 // tasks withdrawn by Completion.Cancel
	// Aborted counts tasks Close gave up on: queued, waiting out a retry
	// backoff or a Snooze, or parked (outcome ErrAborted, never run again), and running
	// tasks whose attempt failed after Close cancelled their context (their
	// own error, dead-lettered like any failure). A running task that
	// returns nil counts in Succeeded.
	Aborted uint64

	Rejected uint64 // tasks refused: Submit and TrySubmit calls that returned an error, and the tasks of a batch not accepted
	// Retried counts retries scheduled (attempts after the first).
	Retried uint64
	// Snoozed counts runs that returned a Snooze error and were scheduled
	// to run again without spending an attempt (not counted in Retried).
	Snoozed uint64
	// DeadLettered counts deliveries to the dead letter (or the log).
	DeadLettered uint64
}

// Stats returns a snapshot of the scheduler's state and counters.
func (s *Scheduler[K]) Stats() Stats {
	if s.zero() {
		return Stats{}
	}
	k := &s.core
	return Stats{
		Keys:         s.tails.m.Size(),
		Pending:      int(s.pending.count()),
		Running:      int(k.running.Value()),
		ParkedKeys:   s.parkedCount(),
		Submitted:    uint64(k.submitted.Value()),
		Succeeded:    uint64(k.outcomes[outSucceeded].Value()),
		Failed:       uint64(k.outcomes[outFailed].Value()),
		Panicked:     uint64(k.outcomes[outPanicked].Value()),
		Cancelled:    uint64(k.outcomes[outCancelled].Value()),
		Aborted:      uint64(k.outcomes[outAborted].Value()),
		Rejected:     k.rejected.Load(),
		Retried:      k.retried.Load(),
		Snoozed:      k.snoozed.Load(),
		DeadLettered: k.deadLettered.Load(),
	}
}
