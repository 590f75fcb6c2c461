package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A MarkHook that panics while a row is marked dead (on the worker that ran
// the row, under keysched's dead-letter recovery) must not strand the row:
// the relay goes on, and the row ends marked dead or published again.
func TestMarkHookPanicOnDeadMarkDoesNotStrandTheRow(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, 2, 2)
		var calls [2]atomic.Int32
		var panicked atomic.Bool
		r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
			j, _ := strconv.Atoi(string(e.Payload))
			if calls[j].Add(1) == 1 && j == 0 {
				return keysched.Permanent(errors.New("rejected"))
			}
			return nil
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond),
			outbox.WithLeaseDuration(2*time.Second),
			outbox.WithMarkHook(func(ctx context.Context, tx *sql.Tx, m []outbox.Marked) error {
				if m[0].State == outbox.Dead && panicked.CompareAndSwap(false, true) {
					panic("hook panic")
				}
				return nil
			}))
		require.NoError(t, err)
		runRelay(t, r)
		require.Eventually(t, func() bool { return panicked.Load() && calls[1].Load() >= 1 }, 10*time.Second, time.Millisecond)
		require.Eventually(t, func() bool { return counts(t, ob)[outbox.Pending] == 0 }, 10*time.Second, 5*time.Millisecond,
			"row 0 left pending and held after the hook's panic (calls %d, %d; stats %+v)", calls[0].Load(), calls[1].Load(), r.Stats())
	})
}

// A MarkHook that panics while published rows are marked sent (on the
// relay's mark goroutine) is a failed mark: the relay survives, counts it,
// and marks the rows again without publishing them again.
func TestMarkHookPanicOnSentMarkIsAFailedMark(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		const perKey = 3
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, perKey, perKey)
		rec := newRecorder(perKey)
		var panics atomic.Int32
		r, err := ob.NewRelay(rec.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond),
			outbox.WithMarkHook(func(ctx context.Context, tx *sql.Tx, m []outbox.Marked) error {
				if panics.Add(1) <= 2 {
					panic("hook panic")
				}
				return nil
			}))
		require.NoError(t, err)
		runRelay(t, r)
		require.Eventually(t, func() bool { return counts(t, ob)[outbox.Pending] == 0 }, 10*time.Second, 5*time.Millisecond)
		require.GreaterOrEqual(t, r.Stats().DBErrors, uint64(2), "each panic counted as a failed mark")
		require.Zero(t, rec.check(t, 1, perKey), "marked again, not published again")
	})
}

// An AfterMarkCommit function that panics after a dead mark committed does
// not strand the row's job: the row stays dead, the key's later rows are
// published, and the relay lets the key go.
func TestAfterMarkCommitPanicOnDeadMarkDoesNotStrandTheKey(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, 2, 2)
		var calls [2]atomic.Int32
		r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
			j, _ := strconv.Atoi(string(e.Payload))
			calls[j].Add(1)
			if j == 0 {
				return keysched.Permanent(errors.New("rejected"))
			}
			return nil
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond),
			outbox.WithMarkHook(func(ctx context.Context, tx *sql.Tx, m []outbox.Marked) error {
				if m[0].State == outbox.Dead {
					outbox.AfterMarkCommit(ctx, func() { panic("after-commit panic") })
				}
				return nil
			}))
		require.NoError(t, err)
		runRelay(t, r)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			c := counts(t, ob)
			if c[outbox.Dead] == 1 && c[outbox.Pending] == 0 && r.Stats().KeysHeld == 0 && r.Stats().InFlight == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("key stranded: calls %d, %d; stats %+v; counts %v", calls[0].Load(), calls[1].Load(), r.Stats(), c)
			}
		}
		require.EqualValues(t, 1, calls[0].Load())
		require.EqualValues(t, 1, calls[1].Load())
	})
}

// An AfterMarkCommit function that panics after a sent mark committed (on
// the relay's mark goroutine) is logged: the relay goes on, the rows stay
// marked, nothing is published again.
func TestAfterMarkCommitPanicOnSentMarkIsLogged(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		const perKey = 3
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, perKey, 1)
		rec := newRecorder(perKey)
		var ran atomic.Int32
		_, _ = startRelay(t, ob, rec.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond),
			outbox.WithMarkHook(func(ctx context.Context, tx *sql.Tx, m []outbox.Marked) error {
				outbox.AfterMarkCommit(ctx, func() { panic("after-commit panic") })
				outbox.AfterMarkCommit(ctx, func() { ran.Add(int32(len(m))) })
				return nil
			}))
		require.Eventually(t, func() bool { return ran.Load() == perKey }, 10*time.Second, 5*time.Millisecond,
			"the functions after a panicking one run")
		require.Empty(t, counts(t, ob))
		require.Zero(t, rec.check(t, 1, perKey))
	})
}
