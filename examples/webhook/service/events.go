package service

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// Errors of Event, Replay and ReplayRange.
var (
	// ErrUnknownEvent: no event of that ID was accepted (or its intake
	// record is gone). For a replay's delivery ID the error says which
	// event it replays.
	ErrUnknownEvent = errors.New("webhook: unknown event")
	// ErrReplayTooMany: a replay's time range holds more than MaxReplay
	// events; nothing was replayed (narrow the range).
	ErrReplayTooMany = errors.New("webhook: too many events to replay at once")
	// ErrReplayNothing: a replay's time range holds no event of the
	// partner.
	ErrReplayNothing = errors.New("webhook: no event to replay")
	// ErrBadRange: a replay range whose start is not before its end, or
	// without one of them.
	ErrBadRange = errors.New("webhook: bad time range")
)

// MaxReplay bounds the events one ReplayRange moves; MaxLookupAttempts the
// attempts one Event lists.
const (
	MaxReplay         = 1000
	MaxLookupAttempts = 1000
)

// webhookIDHeader is the outbox header a replay row carries: the event's
// ID, which the delivery sends as Webhook-Id (the replay row's own outbox ID
// is new, as outbox IDs are unique).
const webhookIDHeader = "webhook-id"

// webhookID returns the ID a row delivers as (Webhook-Id) and whether the
// row is a replay.
func webhookID(e outbox.Event) (string, bool) {
	if id := e.Headers[webhookIDHeader]; id != "" {
		return id, true
	}
	return e.ID, false
}

// Event states, as Event reports them.
const (
	StatePending   = "pending"   // waiting, or being retried (see its attempts)
	StateDelivered = "delivered" // an attempt got a 2xx and the outbox marked the row sent
	StateParked    = "parked"    // out of attempts: it and its partner's later events wait for an operator
	StateSkipped   = "skipped"   // given up by an operator
)

// EventInfo is what the service knows of one event: GET /events/{id}.
type EventInfo struct {
	ID      string    `json:"id"`
	Partner string    `json:"partner"`
	Type    string    `json:"type"`
	Created time.Time `json:"created"` // intake time (UTC)
	// State is the state of the event's latest delivery: its own, or its
	// latest replay's (pending, delivered, parked, skipped).
	State string `json:"state"`
	// DeliveredAt is when the first attempt that got a 2xx ended (or, once
	// its attempts are past the history's retention, when the outbox
	// marked it sent); absent while never delivered.
	DeliveredAt *time.Time `json:"delivered_at,omitempty"`
	// Attempts are the recorded attempts, oldest first (replays'
	// included, each naming its replay), within the history's retention:
	// the latest MaxLookupAttempts of them.
	Attempts []Attempt `json:"attempts"`
	// AttemptsOmitted counts the older attempts left out of Attempts.
	AttemptsOmitted int `json:"attempts_omitted,omitempty"`
	// Replays are the replays an operator asked for, oldest first.
	Replays []ReplayInfo `json:"replays,omitempty"`
	// LastError is the error that parked the event's latest delivery (its
	// own or its latest replay's), while that delivery is parked or
	// skipped; empty (absent) once it is pending or delivered again.
	LastError string `json:"last_error,omitempty"`
}

// ReplayInfo is one replay of an event.
type ReplayInfo struct {
	ID          string    `json:"id"` // the replay's outbox row (not the Webhook-Id, which is the event's)
	RequestedAt time.Time `json:"requested_at"`
	State       string    `json:"state"`
}

// rowState is an outbox row's state as an event state; a row gone from the
// outbox was sent and cleaned up after the retention (dead and skipped rows
// are never deleted).
func rowState(st sql.NullInt64) string {
	if !st.Valid {
		return StateDelivered
	}
	switch outbox.State(st.Int64) {
	case outbox.Pending:
		return StatePending
	case outbox.Sent:
		return StateDelivered
	case outbox.Dead:
		return StateParked
	case outbox.Skipped:
		return StateSkipped
	}
	return fmt.Sprintf("state %d", st.Int64)
}

// Event returns what the service knows of the event id: ErrUnknownEvent if
// none was accepted with it. It costs a few indexed queries.
func (s *Service) Event(ctx context.Context, id string) (EventInfo, error) {
	if s.zero() {
		return EventInfo{}, ErrZeroService
	}
	return s.store.event(ctx, id)
}

// replayOf returns the event whose replay has the delivery (outbox row) ID
// rowID; ok is false when rowID is no replay's (or its record was cleaned
// up with the history).
func (s *Store) replayOf(ctx context.Context, rowID string) (event string, ok bool, err error) {
	err = s.db.QueryRowContext(ctx, s.rebind(`SELECT event_id FROM `+s.replay+` WHERE row_id = ?`), rowID).Scan(&event)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	return event, err == nil, err
}

// checkEventID refuses, as unknown, an ID no event can have: longer than an
// outbox ID, not UTF-8 or with a NUL byte (PostgreSQL would refuse it with
// an error, a 500, where SQLite answers "no such row").
func checkEventID(id string) error {
	switch {
	case len(id) > outbox.MaxIDLen:
		return fmt.Errorf("%w: an ID of %d bytes (at most %d)", ErrUnknownEvent, len(id), outbox.MaxIDLen)
	case !utf8.ValidString(id) || strings.ContainsRune(id, 0):
		return fmt.Errorf("%w: %q (not UTF-8 text)", ErrUnknownEvent, id)
	}
	return nil
}

func (s *Store) event(ctx context.Context, id string) (EventInfo, error) {
	var ev EventInfo
	if err := checkEventID(id); err != nil {
		return ev, err
	}
	var us int64
	err := s.db.QueryRowContext(ctx, s.rebind(`SELECT id, partner, type, received_at FROM `+s.intake+` WHERE id = ?`), id).
		Scan(&ev.ID, &ev.Partner, &ev.Type, &us)
	if errors.Is(err, sql.ErrNoRows) {
		// A replay's delivery ID (PartnerStatus.Head of a partner parked
		// on a replay) is no event: say whose replay it is.
		if of, ok, rerr := s.replayOf(ctx, id); rerr == nil && ok {
			return ev, fmt.Errorf("%w: %q is not an event ID but the delivery ID of a replay of event %q: look up /events/%s (its replays list this one and its state); to skip this replay while it parks its partner, send event=%s", ErrUnknownEvent, id, of, of, id)
		}
		return ev, fmt.Errorf("%w: %q", ErrUnknownEvent, id)
	}
	if err != nil {
		return ev, fmt.Errorf("webhook: event %q: %w", id, err)
	}
	ev.Created = time.UnixMicro(us).UTC()
	// The event's outbox rows: its own, and its replays', in outbox order.
	rows, err := s.db.QueryContext(ctx, s.rebind(`SELECT r.id, r.requested_at, o.state, o.done_at, o.last_error FROM (
	SELECT ? AS id, 0 AS requested_at
	UNION ALL SELECT row_id, requested_at FROM `+s.replay+` WHERE event_id = ?
) r LEFT JOIN `+s.ob.Table()+` o ON o.id = r.id ORDER BY r.requested_at, o.seq`), id, id)
	if err != nil {
		return ev, fmt.Errorf("webhook: event %q: %w", id, err)
	}
	var sentAt time.Time
	for rows.Next() {
		var rowID string
		var req int64
		var state sql.NullInt64
		var lastErr sql.NullString
		done := s.timeDest()
		if err := rows.Scan(&rowID, &req, &state, done, &lastErr); err != nil {
			rows.Close()
			return ev, fmt.Errorf("webhook: event %q: %w", id, err)
		}
		ev.State = rowState(state)
		if t, ok := timeOf(done); ok && state.Valid && outbox.State(state.Int64) == outbox.Sent && sentAt.IsZero() {
			sentAt = t
		}
		// The latest delivery's error, only while it is parked or
		// skipped: the outbox keeps a row's last error after Resume and
		// after delivery, and a replay's row has its own.
		ev.LastError = ""
		if ev.State == StateParked || ev.State == StateSkipped {
			ev.LastError = lastErr.String
		}
		if rowID == id {
			continue
		}
		ev.Replays = append(ev.Replays, ReplayInfo{ID: rowID, RequestedAt: time.UnixMicro(req).UTC(), State: ev.State})
	}
	if err := rows.Err(); err != nil {
		return ev, fmt.Errorf("webhook: event %q: %w", id, err)
	}
	rows.Close()
	if ev.Attempts, err = s.attempts(ctx, id); err != nil {
		return ev, err
	}
	var first sql.NullInt64 // the first delivered attempt's end, µs
	if err := s.db.QueryRowContext(ctx, s.rebind(`SELECT MIN(at + duration_us) FROM `+s.attempt+` WHERE event_id = ? AND error = ''`), id).Scan(&first); err != nil {
		return ev, fmt.Errorf("webhook: event %q: %w", id, err)
	}
	if first.Valid {
		t := time.UnixMicro(first.Int64).UTC()
		ev.DeliveredAt = &t
	}
	if len(ev.Attempts) == MaxLookupAttempts {
		var n int
		if err := s.db.QueryRowContext(ctx, s.rebind(`SELECT COUNT(*) FROM `+s.attempt+` WHERE event_id = ?`), id).Scan(&n); err != nil {
			return ev, fmt.Errorf("webhook: event %q: %w", id, err)
		}
		ev.AttemptsOmitted = max(0, n-MaxLookupAttempts)
	}
	if ev.DeliveredAt == nil && !sentAt.IsZero() {
		ev.DeliveredAt = &sentAt
	}
	if ev.Attempts == nil {
		ev.Attempts = []Attempt{}
	}
	return ev, nil
}

func (s *Store) attempts(ctx context.Context, id string) ([]Attempt, error) {
	rows, err := s.db.QueryContext(ctx, s.rebind(`SELECT row_id, at, duration_us, status, error, body, relay FROM `+s.attempt+` WHERE event_id = ? ORDER BY at DESC LIMIT ?`), id, MaxLookupAttempts)
	if err != nil {
		return nil, fmt.Errorf("webhook: attempts of %q: %w", id, err)
	}
	defer rows.Close()
	var out []Attempt
	for rows.Next() {
		var a Attempt
		var rowID string
		var at, dur int64
		if err := rows.Scan(&rowID, &at, &dur, &a.Status, &a.Error, &a.Body, &a.Relay); err != nil {
			return nil, fmt.Errorf("webhook: attempts of %q: %w", id, err)
		}
		a.At, a.Duration = time.UnixMicro(at).UTC(), time.Duration(dur)*time.Microsecond
		switch {
		case a.Error == "":
			a.Outcome = "delivered"
		case deferredError(a.Status, a.Error):
			a.Outcome = "deferred"
		default:
			a.Outcome = "failed"
		}
		if rowID != id {
			a.Replay = rowID
		}
		out = append(out, a)
	}
	slices.Reverse(out)
	return out, rows.Err()
}

// EventSummary is one line of a partner's latest events.
type EventSummary struct {
	ID       string    `json:"id"`
	Type     string    `json:"type"`
	Created  time.Time `json:"created"`
	State    string    `json:"state"` // of the event's own delivery (see Replays)
	Replays  int       `json:"replays"`
	Attempts int       `json:"attempts"` // recorded attempts, replays' included
}

// LatestEvents returns up to limit (1 to 1000) of the partner's latest
// accepted events, newest first, with their states.
func (s *Service) LatestEvents(ctx context.Context, partner string, limit int) ([]EventSummary, error) {
	if s.zero() {
		return nil, ErrZeroService
	}
	if !s.known(partner) {
		return nil, fmt.Errorf("%w: %q", ErrUnknownPartner, partner)
	}
	if limit < 1 || limit > 1000 {
		return nil, fmt.Errorf("webhook: LatestEvents: limit %d: need 1 to 1000", limit)
	}
	st := s.store
	rows, err := st.db.QueryContext(ctx, st.rebind(`SELECT i.id, i.type, i.received_at, o.state,
	(SELECT COUNT(*) FROM `+st.replay+` r WHERE r.event_id = i.id),
	(SELECT COUNT(*) FROM `+st.attempt+` a WHERE a.event_id = i.id)
FROM `+st.intake+` i LEFT JOIN `+st.ob.Table()+` o ON o.id = i.id
WHERE i.partner = ? ORDER BY i.received_at DESC, i.id DESC LIMIT ?`), partner, limit)
	if err != nil {
		return nil, fmt.Errorf("webhook: latest events of %q: %w", partner, err)
	}
	defer rows.Close()
	var out []EventSummary
	for rows.Next() {
		var e EventSummary
		var us int64
		var state sql.NullInt64
		if err := rows.Scan(&e.ID, &e.Type, &us, &state, &e.Replays, &e.Attempts); err != nil {
			return nil, fmt.Errorf("webhook: latest events of %q: %w", partner, err)
		}
		e.Created, e.State = time.UnixMicro(us).UTC(), rowState(state)
		out = append(out, e)
	}
	return out, rows.Err()
}

// ReplayResult is what a replay did, per event, in delivery order.
type ReplayResult struct {
	// Requeued are events sent again: a new delivery of each, carrying the
	// event's Webhook-Id, queued behind the partner's undelivered events.
	Requeued []string `json:"requeued"`
	// Recovered are parked events (their delivery out of attempts) made
	// pending again with a fresh attempt budget: the partner resumes. (A
	// parked event that a concurrent Resume or Skip moved first is in no
	// list; that is logged.)
	Recovered []string `json:"recovered"`
	// Pending are events not delivered yet (or already sent again by a
	// concurrent replay, not delivered yet), left as they are (they will be
	// delivered; a replay would send them twice).
	Pending []string `json:"pending"`
	// Expired are events whose payload is past the retention (Config.History):
	// they cannot be sent again.
	Expired []string `json:"expired"`
}

// replayCand is one event a replay considers.
type replayCand struct {
	id, partner, typ string
	received         time.Time
	origState        sql.NullInt64
	latestRow        string        // the row of the event's latest delivery
	latestState      sql.NullInt64 // its state
}

// Replay sends the event id again, whatever its state, through the
// partner's chain: a delivered or skipped event gets a new delivery, queued
// behind the partner's undelivered events (so it arrives in order with
// them), with the event's Webhook-Id and body (receivers deduplicate on the
// ID); a parked event is made pending again (its partner resumes); a
// pending one is left as is. ErrUnknownEvent for an unknown ID,
// ErrUnknownPartner for an event of a partner no longer configured (nothing
// is written), ErrClosed after Close. It is logged and counted (webhook.replays). A replay that
// fails after it retried parked events returns them in Recovered, and its
// error names them and the events it did not send again.
func (s *Service) Replay(ctx context.Context, id string) (ReplayResult, error) {
	if id == "" {
		// Not a range replay of partner "" (replay's empty ID means one).
		if s.zero() {
			return ReplayResult{}, ErrZeroService
		}
		return ReplayResult{}, fmt.Errorf("%w: the empty ID", ErrUnknownEvent)
	}
	return s.replay(ctx, "", id, time.Time{}, time.Time{})
}

// ReplayRange is Replay for every event of partner accepted in [from, to)
// (intake time), in their intake order: at most MaxReplay
// (ErrReplayTooMany: nothing done), at least one (ErrReplayNothing).
// ErrUnknownPartner, ErrBadRange (from not before to, or a bound outside
// years 1 to 9999, which the intake times cannot be compared with) are
// refused first.
func (s *Service) ReplayRange(ctx context.Context, partner string, from, to time.Time) (ReplayResult, error) {
	if s.zero() {
		return ReplayResult{}, ErrZeroService
	}
	if !s.known(partner) {
		return ReplayResult{}, fmt.Errorf("%w: %q", ErrUnknownPartner, partner)
	}
	if from.IsZero() || to.IsZero() || !from.Before(to) {
		if from.IsZero() || to.IsZero() {
			return ReplayResult{}, fmt.Errorf("%w: [%v, %v): need both from and to", ErrBadRange, from, to)
		}
		return ReplayResult{}, fmt.Errorf("%w: [%v, %v): from must be before to (the range holds from, not to)", ErrBadRange, from, to)
	}
	// The intake times are stored as Unix microseconds: a far bound (a
	// "max time" such as time.Unix(1<<62, 0)) overflowed them and the
	// range selected nothing, or the wrong events.
	for _, b := range []time.Time{from, to} {
		if b.Before(minRangeTime) || !b.Before(maxRangeTime) {
			return ReplayResult{}, fmt.Errorf("%w: bound %v: need a time in years 1 to 9999", ErrBadRange, b.UTC())
		}
	}
	return s.replay(ctx, partner, "", from, to)
}

// The bounds a replay range may take: years 1 to 9999 (UTC).
var (
	minRangeTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	maxRangeTime = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
)

func (s *Service) replay(ctx context.Context, partner, id string, from, to time.Time) (ReplayResult, error) {
	var res ReplayResult
	if s.zero() {
		return res, ErrZeroService
	}
	if s.closed.Load() {
		return res, ErrClosed
	}
	if id != "" {
		if err := checkEventID(id); err != nil {
			return res, err
		}
	}
	cands, err := s.store.replayCandidates(ctx, partner, id, from, to)
	if err != nil {
		return res, err
	}
	switch {
	case id != "" && len(cands) == 0:
		return res, fmt.Errorf("%w: %q", ErrUnknownEvent, id)
	case len(cands) == 0:
		return res, fmt.Errorf("%w: partner %q, [%v, %v)", ErrReplayNothing, partner, from.UTC(), to.UTC())
	case len(cands) > MaxReplay:
		// The candidates stop at MaxReplay+1: count the range's events.
		n, err := s.store.countRange(ctx, partner, from, to)
		if err != nil {
			return res, err
		}
		return res, fmt.Errorf("%w: %d events in [%v, %v), at most %d", ErrReplayTooMany, n, from.UTC(), to.UTC(), MaxReplay)
	case !s.known(cands[0].partner):
		// A partner removed from the configuration since: its new
		// delivery would fail every attempt, then park a partner that
		// the operator page does not list and its actions refuse.
		return res, fmt.Errorf("%w: %q (event %q): it is no longer configured", ErrUnknownPartner, cands[0].partner, cands[0].id)
	}
	var dead []string
	deadOf := map[string]string{} // row -> event
	var requeue []*replayCand
	for _, c := range cands {
		switch {
		case c.latestState.Valid && outbox.State(c.latestState.Int64) == outbox.Dead:
			dead = append(dead, c.latestRow)
			deadOf[c.latestRow] = c.id
		case c.latestState.Valid && outbox.State(c.latestState.Int64) == outbox.Pending:
			res.Pending = append(res.Pending, c.id)
		case !c.origState.Valid:
			res.Expired = append(res.Expired, c.id)
		default:
			requeue = append(requeue, c)
			res.Requeued = append(res.Requeued, c.id)
		}
	}
	// A parked event first: it is its partner's head (under Park, the
	// partner's only dead row), the new deliveries queue behind it.
	if len(dead) > 0 {
		// Batches committed before an error are returned with it.
		moved, err := s.relay.r.Recover(ctx, outbox.RecoverFilter{IDs: dead})
		got := map[string]bool{}
		for _, m := range moved {
			got[m.ID] = true
		}
		var notRetried []string
		for _, row := range dead {
			if got[row] {
				res.Recovered = append(res.Recovered, deadOf[row])
				continue
			}
			if err != nil {
				notRetried = append(notRetried, deadOf[row])
				continue
			}
			// A concurrent Resume or Skip moved it first: not recovered
			// here (its event's lookup tells what happened).
			s.log.Warn("replay: a parked event was moved by another action meanwhile", "event", deadOf[row])
		}
		if err != nil {
			notSent := res.Requeued
			res.Requeued = nil
			var unknown []string
			if errors.Is(err, outbox.ErrOutcomeUnknown) {
				// The batch whose COMMIT was cut short may have
				// retried them (Recover's error names it; the
				// batches after it, if any, were not tried).
				unknown, notRetried = notRetried, nil
			}
			return res, halfway(res.Recovered, notRetried, unknown, nil, notSent, closedAs(err))
		}
	}
	if len(requeue) > 0 {
		if s.beforeRequeue != nil {
			s.beforeRequeue()
		}
		left, err := s.requeue(ctx, requeue)
		if errors.Is(err, outbox.ErrOutcomeUnknown) {
			// The write's COMMIT was cut short: it may have
			// committed. Not "not sent again".
			unknown := res.Requeued
			res.Requeued = nil
			return res, halfway(res.Recovered, nil, nil, unknown, nil, err)
		}
		if err != nil {
			notSent := res.Requeued
			res.Requeued = nil
			return res, halfway(res.Recovered, nil, nil, nil, notSent, err)
		}
		// Events that changed since the candidates were read: a row the
		// retention deleted (expired), a replay of a concurrent replay
		// now pending (left as is, not sent twice).
		if len(left) > 0 {
			res.Requeued = res.Requeued[:0]
			kept := requeue[:0]
			for _, c := range requeue {
				switch left[c.id] {
				case stateExpired:
					res.Expired = append(res.Expired, c.id)
				case StatePending:
					res.Pending = append(res.Pending, c.id)
				default:
					res.Requeued = append(res.Requeued, c.id)
					kept = append(kept, c)
				}
			}
			requeue = kept
		}
	}
	for _, c := range requeue {
		s.metrics.replayed(ctx, c.partner, "requeued")
	}
	for range res.Recovered {
		s.metrics.replayed(ctx, cands[0].partner, "recovered")
	}
	args := []any{idsAttr("requeued", res.Requeued), idsAttr("recovered", res.Recovered),
		idsAttr("pending", res.Pending), idsAttr("expired", res.Expired)}
	if id != "" {
		s.log.Warn("operator replayed an event", append([]any{"event", id, "partner", cands[0].partner}, args...)...)
	} else {
		s.log.Warn("operator replayed a partner's events", append([]any{"partner", partner, "from", from.UTC(), "to", to.UTC(), "events", len(cands)}, args...)...)
	}
	return res, nil
}

// halfway is the error of a replay that stopped at err: it names the parked
// events it retried before (their partner resumed), those it did not retry
// or send again, and those whose retry (unknownRetried) or new delivery
// (unknownSent) may or may not have been written: the write's COMMIT was
// cut short, and err wraps outbox.ErrOutcomeUnknown. The operator knows
// what was done, and what to look up before replaying again.
func halfway(retried, notRetried, unknownRetried, unknownSent, notSent []string, err error) error {
	var b strings.Builder
	b.WriteString("webhook: replay: ")
	for _, part := range []struct {
		ids  []string
		what string
	}{{retried, "parked %s retried"}, {notRetried, "parked %s not retried"},
		{unknownRetried, "parked %s retried or not (outcome unknown: look them up before replaying again)"},
		{unknownSent, "%s sent again or not (outcome unknown: look them up before replaying again)"},
		{notSent, "%s not sent again"}} {
		if len(part.ids) == 0 {
			continue
		}
		noun := "events"
		if len(part.ids) == 1 {
			noun = "event"
		}
		fmt.Fprintf(&b, "%d "+part.what+" %v", len(part.ids), noun, part.ids[:min(len(part.ids), logIDs)])
		if len(part.ids) > logIDs {
			fmt.Fprintf(&b, " and %d more", len(part.ids)-logIDs)
		}
		b.WriteString("; ")
	}
	if b.Len() == len("webhook: replay: ") {
		return fmt.Errorf("webhook: replay: %w", err)
	}
	return fmt.Errorf("%sthen: %w", b.String(), err)
}

// logIDs bounds the event IDs a replay's log line lists per outcome.
const logIDs = 5

// idsAttr logs a replay outcome's event IDs as a group: their count, and
// the first logIDs of them ("requeued.count=45 requeued.first=[a b c d e]"),
// so that a replay of 1,000 events is one readable line; the answer to the
// request (ReplayResult) lists them all.
func idsAttr(name string, ids []string) slog.Attr {
	return slog.Group(name, "count", len(ids), "first", ids[:min(len(ids), logIDs)])
}

// requeue writes one new outbox row per event (and its replay record), all
// in one transaction: the new deliveries enter the backlog first, as the
// intake's do, so that a delivery always finds its row counted. It returns
// the events left out (not sent again), each with why: stateExpired (the
// retention deleted its row since it was read) or StatePending (a
// concurrent replay's delivery of it is pending).
func (s *Service) requeue(ctx context.Context, cands []*replayCand) (map[string]string, error) {
	now := s.now().UTC()
	rows := make([]string, len(cands))
	for i, c := range cands {
		u, err := uuid.NewV7()
		if err != nil {
			return nil, err
		}
		rows[i] = u.String()
		s.backlog.load(c.partner, rows[i], now)
	}
	left, err := s.store.writeReplays(ctx, cands, rows, now)
	if errors.Is(err, outbox.ErrOutcomeUnknown) {
		// Written or not: counted until the rows tell (unknown.go).
		s.settleUnknownReplay(cands[0].partner, rows)
		return nil, err
	}
	if err != nil {
		for i, c := range cands {
			s.backlog.drop(c.partner, rows[i])
		}
		return nil, err
	}
	for i, c := range cands {
		if left[c.id] != "" {
			s.backlog.drop(c.partner, rows[i])
		}
	}
	if n := len(cands) - len(left); n > 0 {
		s.metrics.enqueued(ctx, cands[0].partner, int64(n))
	}
	return left, nil
}

// stateExpired is writeReplays' word for an event whose payload is gone.
const stateExpired = "expired"

// writeReplays writes the replay rows of cands, each checked again in the
// write transaction (on PostgreSQL, under the event's intake row lock; on
// SQLite, the write transaction excludes the others): an event whose
// original row is gone (deleted by the retention after the candidates were
// read) or that has a pending replay (a concurrent replay's, a double
// click) is left out and returned in left, with stateExpired or
// StatePending.
func (s *Store) writeReplays(ctx context.Context, cands []*replayCand, rows []string, now time.Time) (left map[string]string, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	ins := s.rebind(`INSERT INTO ` + s.replay + ` (row_id, event_id, partner, requested_at) VALUES (?, ?, ?, ?)`)
	sel := s.rebind(`SELECT payload FROM ` + s.ob.Table() + ` WHERE id = ?`)
	pending := s.rebind(`SELECT COUNT(*) FROM ` + s.replay + ` r JOIN ` + s.ob.Table() + ` o ON o.id = r.row_id WHERE r.event_id = ? AND o.state = 0`)
	lock := ""
	if s.ob.Dialect() == outbox.Postgres {
		lock = s.rebind(`SELECT id FROM ` + s.intake + ` WHERE id = ? FOR UPDATE`)
	}
	leave := func(id, why string) {
		if left == nil {
			left = map[string]string{}
		}
		left[id] = why
	}
	for i, c := range cands {
		if lock != "" {
			var id string
			if err := tx.QueryRowContext(ctx, lock, c.id).Scan(&id); err != nil && !errors.Is(err, sql.ErrNoRows) {
				return nil, fmt.Errorf("lock %q: %w", c.id, err)
			}
		}
		var n int
		if err := tx.QueryRowContext(ctx, pending, c.id).Scan(&n); err != nil {
			return nil, fmt.Errorf("replays of %q: %w", c.id, err)
		}
		if n > 0 {
			leave(c.id, StatePending)
			continue
		}
		// One payload in memory at a time (each up to MaxBodyBytes and
		// a little), not a whole range's.
		var payload []byte
		err := tx.QueryRowContext(ctx, sel, c.id).Scan(&payload)
		if errors.Is(err, sql.ErrNoRows) {
			leave(c.id, stateExpired)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("payload of %q: %w", c.id, err)
		}
		// The original's intake time: the body and Webhook-Timestamp are
		// the event's, byte for byte.
		if _, err := s.ob.Write(ctx, tx, outbox.Event{ID: rows[i], Key: c.partner, Type: c.typ, Payload: payload,
			Headers: map[string]string{webhookIDHeader: c.id}, CreatedAt: c.received}); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, ins, rows[i], c.id, c.partner, now.UnixMicro()); err != nil {
			return nil, err
		}
	}
	// An error before the COMMIT left nothing written (the transaction
	// is rolled back, by the server when the connection broke). The
	// COMMIT itself, cut short (the connection broke, or ctx ended, while
	// it was in flight), may have committed: the server goes on with it.
	live := ctx.Err() == nil
	if err := tx.Commit(); err != nil {
		if commitInFlight(ctx, live, err) {
			return nil, errCommitUnknown(err)
		}
		return nil, err
	}
	return left, nil
}

// commitInFlight reports whether err, a COMMIT's error (ctx live before
// it), leaves its outcome unknown: the connection broke, or ctx ended,
// while it may have been in flight. sql.ErrTxDone (the transaction was
// rolled back first, by ctx's end) leaves nothing unknown.
func commitInFlight(ctx context.Context, live bool, err error) bool {
	if errors.Is(err, sql.ErrTxDone) {
		return false
	}
	return sqldb.Classify(err) == sqldb.KindConnection || live && ctx.Err() != nil
}

// countRange counts the partner's events accepted in [from, to) (the
// filter of replayCandidates' range).
func (s *Store) countRange(ctx context.Context, partner string, from, to time.Time) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, s.rebind(`SELECT COUNT(*) FROM `+s.intake+` WHERE partner = ? AND received_at >= ? AND received_at < ?`),
		partner, from.UnixMicro(), to.UnixMicro()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("webhook: replay: counting the range's events: %w", err)
	}
	return n, nil
}

// replayCandidates reads the events a replay considers (one ID, or a
// partner's range), in intake order, each with its original row's state and its latest delivery's row and state. At most MaxReplay+1.
func (s *Store) replayCandidates(ctx context.Context, partner, id string, from, to time.Time) ([]*replayCand, error) {
	q := `SELECT i.id, i.partner, i.type, i.received_at, o.state FROM ` + s.intake + ` i
LEFT JOIN ` + s.ob.Table() + ` o ON o.id = i.id WHERE `
	var args []any
	if id != "" {
		q += `i.id = ?`
		args = append(args, id)
	} else {
		q += `i.partner = ? AND i.received_at >= ? AND i.received_at < ? ORDER BY i.received_at, i.id LIMIT ?`
		args = append(args, partner, from.UnixMicro(), to.UnixMicro(), MaxReplay+1)
	}
	rows, err := s.db.QueryContext(ctx, s.rebind(q), args...)
	if err != nil {
		return nil, fmt.Errorf("webhook: replay: %w", err)
	}
	var out []*replayCand
	for rows.Next() {
		c := &replayCand{}
		var us int64
		if err := rows.Scan(&c.id, &c.partner, &c.typ, &us, &c.origState); err != nil {
			rows.Close()
			return nil, fmt.Errorf("webhook: replay: %w", err)
		}
		c.received = time.UnixMicro(us).UTC()
		c.latestRow, c.latestState = c.id, c.origState
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		rows.Close()
		return nil, fmt.Errorf("webhook: replay: %w", err)
	}
	rows.Close()
	if len(out) == 0 || len(out) > MaxReplay {
		return out, nil
	}
	// The latest replay row of each, if any.
	byID := map[string]*replayCand{}
	var b strings.Builder
	rargs := make([]any, 0, len(out))
	for i, c := range out {
		byID[c.id] = c
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('?')
		rargs = append(rargs, c.id)
	}
	rows, err = s.db.QueryContext(ctx, s.rebind(`SELECT r.event_id, r.row_id, o.state FROM `+s.replay+` r
JOIN `+s.ob.Table()+` o ON o.id = r.row_id WHERE r.event_id IN (`+b.String()+`) ORDER BY o.seq`), rargs...)
	if err != nil {
		return nil, fmt.Errorf("webhook: replay: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var ev, row string
		var state sql.NullInt64
		if err := rows.Scan(&ev, &row, &state); err != nil {
			return nil, fmt.Errorf("webhook: replay: %w", err)
		}
		c := byID[ev]
		c.latestRow, c.latestState = row, state
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("webhook: replay: %w", err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].received.Before(out[j].received) })
	return out, nil
}
