package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/sqldb"
)

// onDeadLetter receives rows whose sink calls failed for good, and rows the
// scheduler's Close gave up on.
func (r *Relay) onDeadLetter(dl keysched.DeadLetter[string]) {
	j, _ := dl.Context.Value(jobKey{}).(*job)
	if j == nil {
		r.log.Error("outbox relay: dead letter without its row", "err", dl.Err)
		return
	}
	if errors.Is(dl.Err, keysched.ErrAborted) || j.t.lost.Load() || r.mono() >= j.t.deadline.Load() || !r.beginMark() {
		j.t.lost.Store(true)
		r.abandon(j)
		return
	}
	// Counted until marked (or given back): Run's shutdown waits for it
	// as for the sink calls in progress (see waitTasksUntil).
	defer r.endMark()
	msg := deadErrText(dl.Err)
	// Bounded as the relay's other calls are (a third of the lease, at
	// least 5 s): a third of the lease alone failed the mark on a database
	// stalled for less than the lease, and the row, left pending, was
	// published again with a fresh attempt budget. The mark itself names
	// the claim, so it cannot land under another relay's.
	ctx, cancel := r.callCtx(context.Background())
	defer cancel()
	args := []any{dl.Attempts, msg, time.Now().UnixMicro(), j.e.Seq, r.cfg.owner, r.token, j.t.epoch}
	if r.o.dialect == Postgres {
		args = []any{j.e.Seq, r.cfg.owner, r.token, dl.Attempts, msg, j.e.Key, j.t.epoch}
	}
	var n int64
	var after []func()
	var err error
	exec := func(ex interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	}) error {
		res, err := ex.ExecContext(ctx, r.o.q.markDead, args...)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	}
	if r.cfg.markHook == nil {
		err = exec(r.o.db)
	} else {
		// The hook in the mark's transaction, when the row was marked.
		err = r.inTx(ctx, func(tx *sql.Tx) error {
			if err := exec(tx); err != nil || n == 0 {
				return err
			}
			var err error
			after, err = r.runHook(ctx, tx, []Marked{{Event: j.e, Claim: r.claim(j.t), State: Dead, Attempts: dl.Attempts, Err: msg, Note: j.note.get()}})
			return err
		})
	}
	if err == nil && n == 0 {
		// The key's lease is no longer ours: another relay holds the key
		// and decides about the row.
		if j.t.fence() {
			r.st.leasesLost.Add(1)
			r.log.Warn("outbox relay: lease on key lost (taken by another relay) before a failed row was marked dead; the row is left to it", "table", r.o.table, "owner", r.cfg.owner, "token", r.token, "epoch", j.t.epoch, "seq", j.e.Seq)
		}
		r.abandon(j)
		return
	}
	if err != nil {
		// Not marked: the row stays pending and its key starts afresh
		// (it will be retried), rather than the key moving past it.
		r.dbError("mark row dead", err)
		j.t.lost.Store(true)
		r.abandon(j)
		return
	}
	r.st.dead.Add(1)
	r.runAfter(after)
	r.log.Warn("outbox relay: row failed for good, marked dead", "table", r.o.table, "id", j.e.ID, "seq", j.e.Seq, "attempts", dl.Attempts, "err", dl.Err, "park", r.cfg.policy == keysched.Park)
	if r.cfg.policy == keysched.Park {
		// The key's later rows in flight give themselves back; the key's
		// dead row keeps every relay off it until Resume or Skip.
		j.t.lost.Store(true)
	}
	if r.cfg.onDead != nil {
		func() {
			// Recovered: unrecovered (keysched's dead-letter recovery
			// would catch it), the row's job would never settle and its
			// key would stay held for good.
			defer func() {
				if p := recover(); p != nil {
					r.log.Error("outbox relay: the WithOnDead function panicked", "table", r.o.table, "id", j.e.ID, "panic", p)
				}
			}()
			r.cfg.onDead(DeadEvent{Event: j.e, Attempts: dl.Attempts, Err: msg, DiedAt: time.Now().UTC()})
		}()
	}
	r.settle(j)
}

// maxErrText bounds a dead row's last_error, in bytes.
const maxErrText = 4096

// deadErrText is err's text as a dead row stores it (last_error, and
// DeadEvent.Err and Marked.Err): valid UTF-8 without NUL bytes (each invalid
// sequence and each NUL becomes U+FFFD), at most maxErrText bytes, cut at a
// character boundary. PostgreSQL's TEXT refuses NUL and invalid UTF-8: the
// mark failed every time, and the row stayed pending and was published
// again, with a fresh attempt budget, for ever. An Error method that
// panics (a nil pointer of an error type whose Error dereferences it, which
// is a non-nil error) gives fmt's text ("<nil>", or the panic): the panic
// left the row in flight for ever, never marked.
func deadErrText(err error) string {
	msg := fmt.Sprint(err) // "<nil>" for nil
	msg = sqldb.StorableText(msg)
	if len(msg) > maxErrText {
		cut := maxErrText
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut]
	}
	return msg
}

// Parked returns the keys with a dead row (see Outbox.Parked): under the
// Park policy, the keys stopped until Resume or Skip.
func (r *Relay) Parked(ctx context.Context) ([]string, error) {
	if r.zero() {
		return nil, ErrZeroRelay
	}
	return r.o.Parked(ctx)
}

// Resume makes the key's oldest dead row pending again (Outbox.Resume) and
// wakes the relay. Any relay of the outbox then publishes it. After Close it
// returns ErrClosed and moves nothing (Outbox.Resume needs no relay).
//
// The Relay's Resume, Skip, SkipHead, SkipEvent and Recover wake the relay
// also when their error wraps ErrOutcomeUnknown (the move may have taken
// effect, and may complete on the server after the call returned): at once,
// and again a second later, so that a move that took effect is not left
// waiting for the relay's next poll (WithPollInterval).
func (r *Relay) Resume(ctx context.Context, key string) error {
	if r.zero() {
		return ErrZeroRelay
	}
	if r.closed() {
		return ErrClosed
	}
	err := r.o.Resume(ctx, key)
	r.signalIfMoved(err)
	return err
}

// Skip gives up the key's oldest dead row (Outbox.Skip) and wakes the relay,
// so that under Park the key goes on with its next row.
func (r *Relay) Skip(ctx context.Context, key string) error {
	_, err := r.SkipHead(ctx, key)
	return err
}

// SkipHead is Skip that also returns the ID of the row it gave up (see
// Outbox.SkipHead; an operator acting on a row they saw wants SkipEvent).
// After Close, Skip and SkipHead return ErrClosed and move nothing
// (Outbox.Skip needs no relay).
func (r *Relay) SkipHead(ctx context.Context, key string) (string, error) {
	if r.zero() {
		return "", ErrZeroRelay
	}
	if r.closed() {
		return "", ErrClosed
	}
	id, err := r.o.SkipHead(ctx, key)
	r.signalIfMoved(err)
	if err != nil {
		return "", err
	}
	return id, nil
}

// SkipEvent gives up the key's dead head only if it is the event id (see
// Outbox.SkipEvent: errors, concurrency) and wakes the relay. After Close
// it returns ErrClosed and moves nothing (Outbox.SkipEvent needs no relay).
func (r *Relay) SkipEvent(ctx context.Context, key, id string) error {
	if r.zero() {
		return ErrZeroRelay
	}
	if r.closed() {
		return ErrClosed
	}
	err := r.o.SkipEvent(ctx, key, id)
	r.signalIfMoved(err)
	return err
}

// signalIfMoved wakes the relay after an operator's move that took effect
// (err nil) or may have (err wraps ErrOutcomeUnknown): an idle relay is
// not notified of a move, and would otherwise wait out its poll interval
// before publishing the key's rows
// (TestRelayMoveWithUnknownOutcomeWakesTheRelay). A move whose outcome is
// unknown may still be running on the server when the call returns (its
// context ended while the statement was in flight): the relay is woken at
// once and again unknownRewake later.
func (r *Relay) signalIfMoved(err error) {
	switch {
	case err == nil:
		r.signal()
	case errors.Is(err, ErrOutcomeUnknown):
		r.signal()
		time.AfterFunc(unknownRewake, r.signal)
	}
}

// unknownRewake is how long after a move of unknown outcome the relay is
// woken a second time (signalIfMoved).
const unknownRewake = time.Second
