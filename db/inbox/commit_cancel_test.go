package inbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
)

// Apply's context ending while the COMMIT is in flight leaves the outcome
// unknown to the client: the server may complete it. Here the COMMIT reaches
// a private server 200 ms after it is sent (a proxy holds the bytes), the
// context ends 100 ms after it is sent, and the server commits. Apply's
// error wraps ErrCommitUnknown, as for a connection lost during the commit.
// It said "inbox: commit: context canceled", which Apply's doc reads as
// "nothing was recorded", while the ID and the effect had committed.
func TestApplyContextEndingDuringTheCommitIsCommitUnknown(t *testing.T) {
	srv := dbtest.NewServer(t)
	proxy := srv.LatencyProxy(t, 0)
	db := proxy.Open(t)
	direct := srv.Open(t)
	bg := context.Background()
	in, effects := setup(t, db)

	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	ok, err := in.Apply(ctx, "e1", func(tx *sql.Tx) error {
		if err := effect(ctx, db, effects, "e1")(tx); err != nil {
			return err
		}
		proxy.SetDelay(200 * time.Millisecond)       // the COMMIT, sent next
		time.AfterFunc(100*time.Millisecond, cancel) // ends ctx while it is held
		return nil
	})
	proxy.SetDelay(0)
	require.False(t, ok)
	require.ErrorIs(t, err, inbox.ErrCommitUnknown)
	require.ErrorIs(t, err, context.Canceled)
	require.Contains(t, err.Error(), `whether the ID "e1" is recorded is unknown`, "no look past ctx's end")
	var n int
	require.Eventually(t, func() bool {
		require.NoError(t, direct.QueryRowContext(bg, `SELECT count(*) FROM `+tableOf(in)+` WHERE id = 'e1'`).Scan(&n))
		return n == 1
	}, 5*time.Second, 10*time.Millisecond, "the commit landed")
	require.Equal(t, 1, applied(t, direct, effects, "e1"))
	ok, err = in.Apply(bg, "e1", effect(bg, db, effects, "e1"))
	require.NoError(t, err)
	require.False(t, ok, "the redelivery finds it handled")
}
