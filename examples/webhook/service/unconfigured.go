package service

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
)

// Undelivered events of partners no longer in Config.Partners (a partner
// removed from the configuration while some of its events were pending or
// parked). Nothing can deliver them (no endpoint, no secret), and no
// operator action reaches a partner the service does not know, so New
// refuses to start while any is left, naming each partner and its count,
// unless Config.SkipUnconfigured asks it to give them up (marked skipped,
// kept in the outbox, logged per partner).

// unconfiguredBacklog returns, per partner absent from known (sorted), how
// many of its outbox rows are undelivered (pending or dead: event or
// replay).
func (s *Store) unconfiguredBacklog(ctx context.Context, known []string) (map[string]int64, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT key, COUNT(*) FROM `+s.ob.Table()+` WHERE state IN (0, 2) GROUP BY key`)
	if err != nil {
		return nil, fmt.Errorf("webhook: counting undelivered events per partner: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var key string
		var n int64
		if err := rows.Scan(&key, &n); err != nil {
			return nil, fmt.Errorf("webhook: counting undelivered events per partner: %w", err)
		}
		if _, ok := slices.BinarySearch(known, key); !ok {
			out[key] = n
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("webhook: counting undelivered events per partner: %w", err)
	}
	return out, nil
}

// skipPartner marks every undelivered outbox row of partner skipped and
// returns how many it marked.
func (s *Store) skipPartner(ctx context.Context, partner string) (int64, error) {
	res, err := s.db.ExecContext(ctx, s.rebind(`UPDATE `+s.ob.Table()+` SET state = 3 WHERE key = ? AND state IN (0, 2)`), partner)
	if err != nil {
		return 0, fmt.Errorf("webhook: skipping the events of unconfigured partner %q: %w", partner, err)
	}
	return res.RowsAffected()
}

// checkUnconfigured refuses (ErrUnconfiguredPartner) undelivered events of
// partners not in the configuration, or skips them under
// Config.SkipUnconfigured.
func (s *Service) checkUnconfigured(ctx context.Context) error {
	left, err := s.store.unconfiguredBacklog(ctx, s.partners)
	if err != nil {
		return err
	}
	if len(left) == 0 {
		return nil
	}
	names := make([]string, 0, len(left))
	for p := range left {
		names = append(names, p)
	}
	slices.Sort(names)
	if !s.cfg.SkipUnconfigured {
		parts := make([]string, len(names))
		for i, p := range names {
			parts[i] = fmt.Sprintf("%q (%d undelivered)", p, left[p])
		}
		return fmt.Errorf("%w: %s: add the partner back to deliver or skip its events, or start with SkipUnconfigured (-skip-unconfigured) to mark them skipped", ErrUnconfiguredPartner, strings.Join(parts, ", "))
	}
	for _, p := range names {
		n, err := s.store.skipPartner(ctx, p)
		if err != nil {
			return err
		}
		s.log.Warn("skipped the undelivered events of a partner no longer configured", slog.String("partner", p), slog.Int64("events", n))
	}
	return nil
}
