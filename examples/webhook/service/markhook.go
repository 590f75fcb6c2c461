package service

import (
	"context"
	"database/sql"

	"github.com/keysched/keysched/db/outbox"
)

// A delivered attempt is recorded in the transaction that marks its row
// sent (outbox.WithMarkHook): on record if and only if the row is marked.
// The sink hands the attempt to the hook with outbox.SetMarkNote; the hook
// writes the attempts of the rows the transaction marked (a row on a key
// whose lease was lost is not marked and not given to the hook: its
// delivery is not recorded, and the key's next holder delivers it again,
// recorded then). The bookkeeping in memory (backlog, delivery counters)
// follows the commit (outbox.AfterMarkCommit).
//
// When the hook fails (the attempt table cannot be written) or the
// transaction does not commit, neither the marks nor the attempts are
// written: the rows stay pending and held by the relay, which marks them
// again, hook included, every poll interval, without delivering them again;
// a relay that stops (or loses the lease) first leaves them pending, and
// they are delivered again, each delivery then recorded with its own mark.
//
// Failed attempts mark nothing (a row marked dead was failed by its last
// attempt, already recorded): they are recorded before the sink returns, by
// the history's group commit (history.go).

// markHook is the relay's outbox.MarkHook.
func (s *Service) markHook(ctx context.Context, tx *sql.Tx, marked []outbox.Marked) error {
	recs := make([]*attemptRec, 0, len(marked))
	for _, m := range marked {
		if rec, ok := m.Note.(*attemptRec); ok && m.State == outbox.Sent {
			recs = append(recs, rec)
		}
	}
	if err := s.store.insertAttempts(ctx, tx, s.history.stmt, recs); err != nil {
		return err
	}
	if f := s.markFault.Load(); f != nil {
		if err := (*f)(ctx, tx); err != nil {
			return err
		}
	}
	if len(recs) == 0 {
		return nil
	}
	outbox.AfterMarkCommit(ctx, func() {
		for _, rec := range recs {
			s.delivered(rec)
		}
	})
	return nil
}

// delivered does the bookkeeping of a delivery whose attempt and mark have
// committed.
func (s *Service) delivered(rec *attemptRec) {
	ctx := context.Background()
	s.backlog.done(rec.partner, rec.rowID, true)
	s.metrics.settled(ctx, rec.partner)
	if rec.replay {
		s.metrics.deliveredReplay(ctx, rec.partner)
	} else {
		s.metrics.delivered(ctx, rec.partner, s.now().Sub(rec.received))
	}
}
