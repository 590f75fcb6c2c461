package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A row committed after a later row of its key was published, on a key that
// lingers (drained, its lease kept), goes out when its commit wakes the
// relay, not once the linger has ended. The relay polls every hour (its
// linger is an hour too): only the notification can bring the row out in
// time. Before, the lingering key was fetched beyond its cursor (the later
// row's seq) only, and the notified poll found nothing: the row waited for
// the linger's end and the next poll, up to two hours here (when drained
// keys were released at once, it went out at the notification).
func TestLateCommittedRowOnLingeringKeyGoesOutWhenNotified(t *testing.T) {
	db := dbtest.Postgres(t)
	ctx := context.Background()
	ob := newOutbox(t, db)
	s := newClaimSink()
	r, _ := startRelay(t, ob, s.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(time.Hour))
	waitUntil(t, "relay idle", func() bool { return outbox.Idle(r) })

	// The late row's transaction inserts first (a lower seq) while the
	// relay is idle: it notifies at its commit.
	late, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer late.Rollback()
	_, err = ob.Write(ctx, late, outbox.Event{Key: "k", Payload: []byte("late")})
	require.NoError(t, err)

	commitEvent(t, ob, "k", "next")
	s.wait(t, "next", 30*time.Second)
	waitUntil(t, "next marked, the key lingering, the relay idle again", func() bool {
		return r.Stats().Marked == 1 && r.Stats().KeysHeld == 1 && outbox.Idle(r)
	})
	n := r.Stats().Notifications
	require.NoError(t, late.Commit())
	waitUntil(t, "the late row's notification", func() bool { return r.Stats().Notifications > n })
	s.wait(t, "late", 5*time.Second)
}

// A dead row recovered (Relay.Recover, which wakes the relay) on a key that
// lingers after its later rows went out (Continue) goes out at once, not
// once the linger has ended. The relay polls every hour (its linger is an
// hour too). Before, the lingering key was fetched beyond its cursor only:
// the recovered row waited for the linger's end and the next poll (up to
// two hours here; when drained keys were released at once, the relay's
// next poll claimed the key afresh and published it).
func TestRecoveredRowOnLingeringKeyGoesOutWhenRecovered(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		s := newClaimSink()
		var fail atomic.Bool
		fail.Store(true)
		r, _ := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
			if string(e.Payload) == "0" && fail.Load() {
				return errors.New("refused")
			}
			return s.sink(ctx, e)
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(time.Hour),
			outbox.WithFailurePolicy(keysched.Continue), outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 1}))
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		for _, p := range []string{"0", "1"} {
			_, err = ob.Write(ctx, tx, outbox.Event{Key: "k", Payload: []byte(p)})
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
		s.wait(t, "1", 30*time.Second)
		waitUntil(t, "0 dead, 1 marked, the key lingering", func() bool {
			st := r.Stats()
			return st.Dead == 1 && st.Marked == 1 && st.KeysHeld == 1
		})
		fail.Store(false)
		moved, err := r.Recover(ctx, outbox.RecoverFilter{Keys: []string{"k"}})
		require.NoError(t, err)
		require.Len(t, moved, 1)
		s.wait(t, "0", 5*time.Second)
	})
}
