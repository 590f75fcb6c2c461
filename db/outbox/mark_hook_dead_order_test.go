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

// Under Park, a dead mark whose hook fails leaves the head row pending: the
// key's later rows (fetched with it, in flight) are never published before
// the head row is marked dead, and then not at all (the key is parked).
func TestMarkHookFailingOnParkDeadMarkNeverPublishesLaterRows(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, 5, 5)
		var later, head, hookFails atomic.Int32
		r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
			if j, _ := strconv.Atoi(string(e.Payload)); j > 0 {
				later.Add(1)
				return nil
			}
			head.Add(1)
			return keysched.Permanent(errors.New("rejected"))
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond), outbox.WithFailurePolicy(keysched.Park),
			outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 1}),
			outbox.WithMarkHook(func(ctx context.Context, tx *sql.Tx, m []outbox.Marked) error {
				if m[0].State == outbox.Dead && hookFails.Add(1) <= 3 {
					return errors.New("audit down")
				}
				return nil
			}))
		require.NoError(t, err)
		runRelay(t, r)
		require.Eventually(t, func() bool { return r.Stats().Dead == 1 }, 30*time.Second, time.Millisecond)
		waitPolls(t, r, 5)
		require.GreaterOrEqual(t, head.Load(), int32(4))
		require.Zero(t, later.Load(), "a later row of a parked key was published")
		require.Equal(t, map[outbox.State]int64{outbox.Dead: 1, outbox.Pending: 4}, counts(t, ob))
	})
}

// Under Continue, a dead mark whose hook fails leaves the head row pending:
// the key's later rows wait for it, and the stream goes on in order once
// the head row is published again (here it then succeeds).
func TestMarkHookFailingOnDeadMarkKeepsKeyOrder(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		const perKey = 5
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, perKey, perKey)
		rec := newRecorder(perKey)
		var headCalls atomic.Int32
		r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
			_ = rec.sink(ctx, e)
			if j, _ := strconv.Atoi(string(e.Payload)); j == 0 && headCalls.Add(1) == 1 {
				return keysched.Permanent(errors.New("rejected once"))
			}
			return nil
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond),
			outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 1}),
			outbox.WithMarkHook(func(ctx context.Context, tx *sql.Tx, m []outbox.Marked) error {
				if m[0].State == outbox.Dead {
					return errors.New("audit down")
				}
				return nil
			}))
		require.NoError(t, err)
		runRelay(t, r)
		require.Eventually(t, func() bool { return len(counts(t, ob)) == 0 }, 30*time.Second, time.Millisecond)
		require.Equal(t, 1, rec.check(t, 1, perKey), "the head row once more, then the rest in order")
	})
}
