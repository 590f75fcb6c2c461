package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/keysched/keysched/db/outbox"
)

// An operator action whose database write was cut short (the connection
// broke, or the request's context ended, while the statement or the COMMIT
// was in flight) may or may not have taken effect: the call returns an error
// wrapping outbox.ErrOutcomeUnknown, and the in-memory backlog cannot be
// told what happened. Left as it was, it drifted for good: a skip that took
// effect left the event counted (the backlog high, on SQLite for ever, as no
// delivery would ever take it off). Instead the service reads the rows'
// states afterwards, until they tell (watchUnknown), and settles the backlog
// then.

// unknownPoll is how often an unknown outcome's rows are read again (the
// first read is at once).
const unknownPoll = time.Second

// unknownReplayFor bounds how long a replay's new deliveries, whose commit
// was cut short, are looked for: not found by then, they were not written
// (a COMMIT the server still runs after that long is not expected), and
// they leave the backlog. (Service.unknownReplayFor, for tests.)
const unknownReplayFor = time.Minute

// watchUnknown runs check at once, then every unknownPoll, until it returns
// true (the outcome is known and settled) or the service closes. Each check
// gets a context bounded to 5 s, which Close cancels. Not started after
// Close; Close waits for the watchers (their reads cancelled: a database
// that hangs does not hold Close up to 5 s).
func (s *Service) watchUnknown(check func(ctx context.Context) bool) {
	s.unknownMu.Lock()
	defer s.unknownMu.Unlock()
	if s.closed.Load() {
		return
	}
	s.unknown.Add(1)
	go func() {
		defer s.unknown.Done()
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-s.bgStop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(s.bgCtx, 5*time.Second)
			ok := check(ctx)
			cancel()
			if ok {
				return
			}
			t.Reset(unknownPoll)
		}
	}()
}

// waitUnknown, in Close after bgStop is closed, waits for the watchers: a
// watcher is started only before closed is set (under unknownMu).
func (s *Service) waitUnknown() {
	s.unknownMu.Lock()
	s.unknownMu.Unlock() //nolint:staticcheck // a barrier: every Add happened before
	s.unknown.Wait()
}

// settleUnknownSkip follows a skip of partner's head id whose outcome is
// unknown: while the row is dead the skip has not taken effect (on
// PostgreSQL the server may still run it); once skipped, the event leaves
// the backlog and is counted (unless the backlog no longer holds it: a
// later Skip, or a backlog sync, took it off); once pending, sent or gone,
// the skip did not happen and the event is another path's to settle.
func (s *Service) settleUnknownSkip(partner, id string) {
	s.watchUnknown(func(ctx context.Context) bool {
		st, err := s.store.ob.Lookup(ctx, id)
		switch {
		case errors.Is(err, outbox.ErrNotFound):
			return true
		case err != nil:
			s.log.Debug("operator skip, outcome unknown: reading the event's state", "partner", partner, "event", id, "err", err)
			return false
		case st.State == outbox.Dead:
			return false
		case st.State == outbox.Skipped:
			if s.backlog.doneIfPending(partner, id, false) {
				s.metrics.settled(context.Background(), partner)
				s.log.Warn("operator skipped an event (its skip's outcome was unknown: it took effect)", "partner", partner, "event", id)
			}
			return true
		}
		s.log.Info("operator skip, outcome unknown: it did not take effect", "partner", partner, "event", id, "state", st.State)
		return true
	})
}

// settleUnknownReplay follows a replay's write of new deliveries (rows, of
// partner, counted in the backlog) whose commit's outcome is unknown: each
// row found (in any state) was written and stays counted until delivered;
// the rows still not found after unknownReplayFor were not, and leave the
// backlog.
func (s *Service) settleUnknownReplay(partner string, rows []string) {
	deadline := time.Now().Add(s.unknownReplayFor)
	left := append([]string(nil), rows...)
	s.watchUnknown(func(ctx context.Context) bool {
		var still []string
		for _, row := range left {
			_, err := s.store.ob.Lookup(ctx, row)
			switch {
			case errors.Is(err, outbox.ErrNotFound):
				still = append(still, row)
			case err != nil:
				return false
			}
		}
		if len(still) < len(left) {
			s.log.Info("replay, outcome unknown: new deliveries found written", "partner", partner, "rows", len(left)-len(still))
			s.metrics.enqueued(context.Background(), partner, int64(len(left)-len(still)))
		}
		left = still
		if len(left) == 0 {
			return true
		}
		if time.Now().Before(deadline) {
			return false
		}
		for _, row := range left {
			s.backlog.drop(partner, row)
		}
		s.log.Info("replay, outcome unknown: new deliveries not written", "partner", partner, "rows", len(left), "after", s.unknownReplayFor)
		return true
	})
}

// errCommitUnknown wraps a replay write's error whose COMMIT may have taken
// effect.
func errCommitUnknown(err error) error {
	return fmt.Errorf("%w: the commit was cut short: %w", outbox.ErrOutcomeUnknown, err)
}
