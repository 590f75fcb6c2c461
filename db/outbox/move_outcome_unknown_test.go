package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A Skip, Resume or Recover whose context ends while its statement (a
// Recover: its batch's COMMIT) is in flight may have taken effect: the
// server goes on with it. Its error wraps ErrOutcomeUnknown. It said
// `outbox: skipped key "k000": context canceled` while the row had been
// skipped: an operator trying again gave up the key's next dead row too.
// Here a proxy holds the statement 200 ms and the context ends after 100.
func TestMoveCutShortInFlightSaysItMayHaveHappened(t *testing.T) {
	srv := dbtest.NewServer(t)
	proxy := srv.LatencyProxy(t, 0)
	db := proxy.Open(t)
	db.SetMaxOpenConns(1) // the statements below on a connection just used
	ob := newOutbox(t, db)
	writeEvents(t, ob, 4, 2, 10)
	bg := context.Background()
	_, err := db.ExecContext(bg, `UPDATE `+ob.Table()+` SET state = 2`)
	require.NoError(t, err)
	inFlight := func(f func(ctx context.Context) error) error {
		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		proxy.SetDelay(200 * time.Millisecond)
		time.AfterFunc(100*time.Millisecond, cancel)
		defer proxy.SetDelay(0)
		return f(ctx)
	}
	for name, c := range map[string]struct {
		warm, move func(ctx context.Context) error
		state      outbox.State
	}{
		"SkipHead": {
			warm:  func(ctx context.Context) error { _, err := ob.SkipHead(ctx, "none"); return err },
			move:  func(ctx context.Context) error { _, err := ob.SkipHead(ctx, key(0)); return err },
			state: outbox.Skipped,
		},
		"Resume": {
			warm:  func(ctx context.Context) error { return ob.Resume(ctx, "none") },
			move:  func(ctx context.Context) error { return ob.Resume(ctx, key(1)) },
			state: outbox.Pending,
		},
	} {
		// The same statement first, so that it is prepared: the one
		// below is sent whole at once.
		require.ErrorIs(t, c.warm(bg), outbox.ErrNotParked, name)
		err := inFlight(c.move)
		require.ErrorIs(t, err, outbox.ErrOutcomeUnknown, name)
		require.ErrorIs(t, err, context.Canceled, name)
		require.Eventually(t, func() bool { return counts(t, ob)[c.state] == 1 }, 5*time.Second, 10*time.Millisecond,
			"%s: the move took effect", name)
	}
	// SkipEvent, and tried again after the unknown outcome: the retry
	// does not give up the key's next dead row (SkipHead's would).
	var head string
	require.NoError(t, db.QueryRowContext(bg, `SELECT id FROM `+ob.Table()+` WHERE key = $1 ORDER BY seq LIMIT 1`, key(3)).Scan(&head))
	require.ErrorIs(t, ob.SkipEvent(bg, "none", head), outbox.ErrNotParked)
	err = inFlight(func(ctx context.Context) error { return ob.SkipEvent(ctx, key(3), head) })
	require.ErrorIs(t, err, outbox.ErrOutcomeUnknown)
	require.ErrorIs(t, err, context.Canceled)
	require.Eventually(t, func() bool { return counts(t, ob)[outbox.Skipped] == 2 }, 5*time.Second, 10*time.Millisecond,
		"SkipEvent: the move took effect")
	require.ErrorIs(t, ob.SkipEvent(bg, key(3), head), outbox.ErrHeadChanged, "the retry")
	require.EqualValues(t, 2, counts(t, ob)[outbox.Skipped], "the retry gave up nothing")
	// Recover: its context ends while the batch's COMMIT is held.
	f := outbox.RecoverFilter{Keys: []string{key(2)}}
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	outbox.BeforeRecoverCommit(ob, func() {
		proxy.SetDelay(200 * time.Millisecond)
		time.AfterFunc(100*time.Millisecond, cancel)
	})
	moved, err := ob.Recover(ctx, f)
	proxy.SetDelay(0)
	outbox.BeforeRecoverCommit(ob, nil)
	require.ErrorIs(t, err, outbox.ErrOutcomeUnknown)
	require.Contains(t, err.Error(), "2 rows")
	require.Empty(t, moved)
	require.Eventually(t, func() bool { return counts(t, ob)[outbox.Pending] == 3 }, 5*time.Second, 10*time.Millisecond,
		"the batch committed")
}
