package service

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// AttemptBodyBytes bounds the response body kept with each recorded
// attempt: its first BodyPrefixBytes (256) bytes (invalid UTF-8 and NUL bytes replaced by
// U+FFFD, so the record is text on both databases).
const AttemptBodyBytes = BodyPrefixBytes

// A Call is what one delivery attempt's HTTP call returned. Deliver
// fills the Call a Delivery points to (a nil Delivery.Call records
// nothing); it stays zero when no call was made (a local refusal). How the
// answer is classified is Classify's (response.go).
type Call struct {
	Called   bool          // the request was sent (an answer came, or a transport error)
	Start    time.Time     // when the request was sent
	Duration time.Duration // request sent to response body read (or the transport's error)
	Status   int           // the HTTP status; 0 when no response came
	Body     []byte        // the response body's first AttemptBodyBytes bytes
}

// record is the deliverer's hook: the call that started at start ended with
// status (0: a transport error) and body's first bytes.
func (o *Call) record(start time.Time, status int, body []byte) {
	if o == nil {
		return
	}
	*o = Call{Called: true, Start: start, Duration: time.Since(start), Status: status, Body: body}
}

// Attempt is one recorded delivery attempt of an event.
type Attempt struct {
	At time.Time `json:"at"` // when the request was sent (UTC)
	// Duration is how long the attempt took. Its JSON "duration" is in
	// nanoseconds (time.Duration's encoding, kept for compatibility); the
	// JSON also carries "duration_ms", the same in milliseconds (float).
	Duration time.Duration `json:"duration"`
	// Outcome is "delivered" (a 2xx), "deferred" (a 429 or 503 with
	// Retry-After: the endpoint asked to wait, no attempt was spent;
	// result="deferred" in the metrics) or "failed".
	Outcome string `json:"outcome"`
	Status  int    `json:"status,omitempty"` // the HTTP status; absent when none came
	Error   string `json:"error,omitempty"`  // the attempt's error; absent when delivered
	Body    string `json:"body,omitempty"`   // the response body's first AttemptBodyBytes bytes
	Relay   string `json:"relay"`            // the RelayName of the instance that made it
	// Replay is the ID of the replay (see Service.Replay) this attempt
	// delivered; absent for the event's own deliveries.
	Replay string `json:"replay,omitempty"`
}

// MarshalJSON encodes a as its fields' tags say, plus "duration_ms":
// Duration in milliseconds (a float, to the nanosecond).
func (a Attempt) MarshalJSON() ([]byte, error) {
	type plain Attempt // no MarshalJSON: no recursion
	return json.Marshal(struct {
		plain
		DurationMS float64 `json:"duration_ms"`
	}{plain(a), float64(a.Duration) / float64(time.Millisecond)})
}

// attemptRec is one attempt to write.
type attemptRec struct {
	eventID, rowID, partner string
	a                       Attempt
	done                    chan error
	// a delivered attempt's, for the bookkeeping after its mark (markhook.go)
	replay   bool
	received time.Time
}

// history writes the failed attempts: a group commit like the intake's
// (every attempt waiting at that moment, up to maxBatch, in one
// transaction), on its own goroutine, so that a delivery waits for its own
// record's commit only. A delivered attempt is written by the outbox's mark
// transaction instead (markhook.go), with its statement. It is closed after
// the relay, so that the attempts in flight at Close are recorded.
type history struct {
	*groupCommit[*attemptRec]
	stmt *sql.Stmt // the insert, prepared once (nil if preparing failed: then unprepared)
}

func newHistory(st *Store) *history {
	h := &history{}
	h.stmt, _ = st.db.PrepareContext(context.Background(), st.insertAttempt())
	h.groupCommit = newGroupCommit(func(ctx context.Context, batch []*attemptRec) error {
		return st.writeAttempts(ctx, h.stmt, batch)
	}, func(r *attemptRec, err error) { r.done <- err })
	return h
}

// record writes one attempt and returns once its transaction committed or
// failed (ErrClosed after close).
func (h *history) record(r *attemptRec) error {
	r.done = make(chan error, 1)
	select {
	case h.in <- r:
	case <-h.stop:
		return ErrClosed
	}
	select {
	case err := <-r.done:
		return err
	case <-h.done:
		select {
		case err := <-r.done:
			return err
		default:
			return ErrClosed
		}
	}
}

func (h *history) close() {
	h.groupCommit.close()
	if h.stmt != nil {
		_ = h.stmt.Close()
	}
}

// cleaner deletes the history older than retention every interval until
// stop closes.
func (s *Service) cleaner(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	every := min(s.cfg.History/10, 10*time.Minute)
	t := time.NewTicker(max(every, time.Second))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if n, err := s.store.cleanupHistory(ctx, s.now().Add(-s.cfg.History)); err != nil {
				s.log.Error("history cleanup", "err", err)
			} else if n > 0 {
				s.log.Debug("history cleanup", "deleted", n)
			}
			cancel()
		}
	}
}

// historyTables creates the attempt and replay tables and the intake's
// per-partner index, if missing.
func (s *Store) historyTables(ctx context.Context) error {
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS ` + s.attempt + ` (
	event_id    TEXT NOT NULL,
	row_id      TEXT NOT NULL,
	partner     TEXT NOT NULL,
	at          BIGINT NOT NULL,
	duration_us BIGINT NOT NULL,
	status      INTEGER NOT NULL,
	error       TEXT NOT NULL,
	body        TEXT NOT NULL,
	relay       TEXT NOT NULL
)`,
		`CREATE INDEX IF NOT EXISTS ` + s.attempt + `_event ON ` + s.attempt + ` (event_id, at)`,
		`CREATE INDEX IF NOT EXISTS ` + s.attempt + `_at ON ` + s.attempt + ` (at)`,
		`CREATE TABLE IF NOT EXISTS ` + s.replay + ` (
	row_id       TEXT PRIMARY KEY,
	event_id     TEXT NOT NULL,
	partner      TEXT NOT NULL,
	requested_at BIGINT NOT NULL
)`,
		`CREATE INDEX IF NOT EXISTS ` + s.replay + `_event ON ` + s.replay + ` (event_id)`,
		`CREATE INDEX IF NOT EXISTS ` + s.intake + `_partner ON ` + s.intake + ` (partner, received_at)`,
	} {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("webhook: create history tables: %w\n%s", err, stmt)
		}
	}
	return nil
}

// text makes b storable as TEXT on both databases.
func text(b []byte) string { return sqldb.StorableText(string(b)) }

func (s *Store) insertAttempt() string {
	return s.rebind(`INSERT INTO ` + s.attempt + ` (event_id, row_id, partner, at, duration_us, status, error, body, relay) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`)
}

// writeAttempts writes the batch in one transaction, with stmt (the
// prepared insertAttempt) when not nil.
func (s *Store) writeAttempts(ctx context.Context, stmt *sql.Stmt, batch []*attemptRec) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := s.insertAttempts(ctx, tx, stmt, batch); err != nil {
		return err
	}
	return tx.Commit()
}

// insertAttempts writes the batch in tx, with stmt (the prepared
// insertAttempt) when not nil.
func (s *Store) insertAttempts(ctx context.Context, tx *sql.Tx, stmt *sql.Stmt, batch []*attemptRec) error {
	if len(batch) == 0 {
		return nil
	}
	ins := s.insertAttempt()
	var ts *sql.Stmt
	if stmt != nil {
		ts = tx.StmtContext(ctx, stmt)
		defer ts.Close()
	}
	for _, r := range batch {
		a := r.a
		args := []any{r.eventID, r.rowID, r.partner, a.At.UnixMicro(), a.Duration.Microseconds(), a.Status, text([]byte(a.Error)), a.Body, a.Relay}
		var err error
		if ts != nil {
			_, err = ts.ExecContext(ctx, args...)
		} else {
			_, err = tx.ExecContext(ctx, ins, args...)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// cleanupHistory deletes the attempts recorded before cutoff, and the
// replay records requested before it whose outbox row is settled (sent and
// cleaned up, or skipped). It returns the rows deleted.
func (s *Store) cleanupHistory(ctx context.Context, cutoff time.Time) (int64, error) {
	var n int64
	for _, q := range []string{
		`DELETE FROM ` + s.attempt + ` WHERE at < ?`,
		`DELETE FROM ` + s.replay + ` WHERE requested_at < ? AND NOT EXISTS (SELECT 1 FROM ` + s.ob.Table() + ` o WHERE o.id = ` + s.replay + `.row_id AND o.state IN (0, 2))`,
	} {
		res, err := s.db.ExecContext(ctx, s.rebind(q), cutoff.UnixMicro())
		if err != nil {
			return n, err
		}
		d, _ := res.RowsAffected()
		n += d
	}
	return n, nil
}

// timeDest and timeOf scan the outbox table's times (TIMESTAMPTZ on
// PostgreSQL, microseconds on SQLite).
func (s *Store) timeDest() any {
	if s.ob.Dialect() == outbox.Postgres {
		return new(sql.NullTime)
	}
	return new(sql.NullInt64)
}

func timeOf(dest any) (time.Time, bool) {
	switch v := dest.(type) {
	case *sql.NullTime:
		return v.Time.UTC(), v.Valid
	case *sql.NullInt64:
		return time.UnixMicro(v.Int64).UTC(), v.Valid
	}
	return time.Time{}, false
}
