package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// claimLog is a sink that records the Claim of every call.
type claimLog struct {
	mu     sync.Mutex
	claims []outbox.Claim
	seqs   []int64
}

func (c *claimLog) record(ctx context.Context, e outbox.Event) {
	cl, ok := outbox.ClaimFrom(ctx)
	if !ok {
		panic("sink context without a claim")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.claims = append(c.claims, cl)
	c.seqs = append(c.seqs, e.Seq)
}

func (c *claimLog) snapshot() []outbox.Claim {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]outbox.Claim(nil), c.claims...)
}

// A sink call's context carries its claim: the row's key, the relay's name
// and token, and an epoch that grows with every claim of the key, also
// when the lease row was deleted in between (the key went idle and was
// released, then claimed again for new rows).
func TestClaimFromGivesGrowingEpochs(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		var log claimLog
		rec := newRecorder(0)
		r, _ := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
			log.record(ctx, e)
			rec.record(e)
			return nil
		}, outbox.WithLogger(quiet), outbox.WithOwner("svc"), outbox.WithPollInterval(2*time.Millisecond))
		const keys, rounds = 3, 3
		for round := range rounds {
			writeEvents(t, ob, keys, 1, keys)
			require.Eventually(t, func() bool { return len(log.snapshot()) == keys*(round+1) }, 30*time.Second, time.Millisecond)
			// Each key goes idle and is released before the next round.
			require.Eventually(t, func() bool { return len(leaseTokens(t, ob)) == 0 }, 30*time.Second, time.Millisecond)
		}
		last := map[string]int64{}
		for _, c := range log.snapshot() {
			require.Equal(t, "svc", c.Owner)
			require.Equal(t, r.Token(), c.Token)
			require.Positive(t, c.Epoch)
			require.Greater(t, c.Epoch, last[c.Key], "key %s: a later claim's epoch", c.Key)
			last[c.Key] = c.Epoch
		}
		require.Len(t, last, keys)
		_, ok := outbox.ClaimFrom(context.Background())
		require.False(t, ok)
		_, ok = outbox.ClaimFrom(nil) //nolint:staticcheck // a nil context is refused, not a panic
		require.False(t, ok)
	})
}

// A relay that lost a key and claimed it again is a new claim: nothing it
// does under the old one counts. Here the relay's lease row gets a new epoch
// (under the relay's own name and token, as its new claim would) while a
// sink call of the old claim runs: the call's success marks nothing (the
// row stays pending, the old claim is fenced), the old claim's release
// leaves the lease row alone, and the relay publishes the row again under
// a new claim with a greater epoch. With marks fenced by the token alone,
// the old claim marked the row sent.
func TestOldClaimMarksNothing(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, 1, 1)
		var log claimLog
		started, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		r, stop := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
			log.record(ctx, e)
			once.Do(func() {
				close(started)
				<-release // ignores ctx: the old claim's call lands late
			})
			return nil
		}, outbox.WithLogger(quiet), outbox.WithOwner("svc"), outbox.WithPollInterval(2*time.Millisecond),
			outbox.WithLeaseDuration(time.Hour))
		<-started
		bump := `UPDATE ` + ob.Table() + `_lease SET epoch = epoch + 1000 WHERE key = ?`
		if ob.Dialect() == outbox.Postgres {
			bump = `UPDATE ` + ob.Table() + `_lease SET epoch = epoch + 1000 WHERE key = $1`
		}
		_, err := db.ExecContext(ctx, bump, key(0))
		require.NoError(t, err)
		close(release)
		require.Eventually(t, func() bool { return len(log.snapshot()) == 2 }, 30*time.Second, time.Millisecond)
		stop()
		claims := log.snapshot()
		require.Equal(t, claims[0].Token, claims[1].Token)
		require.NotEqual(t, claims[0].Epoch, claims[1].Epoch, "the second delivery is under a new claim")
		require.Greater(t, claims[1].Epoch, claims[0].Epoch)
		st := r.Stats()
		require.EqualValues(t, 1, st.LeasesLost, "the old claim's mark found its claim gone")
		require.EqualValues(t, 1, st.Marked, "only the new claim's mark counts")
		require.Empty(t, counts(t, ob))
	})
}

// A mark whose snapshot predates a takeover must not land after it
// (PostgreSQL, READ COMMITTED: the mark's check of the lease row reads its
// statement's snapshot). The relay's mark of a published row is held up by
// a lock on the outbox row (taken before the mark, released after the
// takeover), and the key is taken over meanwhile. Either the takeover waits
// for the mark (the mark holds the lease row) or the mark, once it goes on,
// touches nothing; it may not delete the row after the takeover committed,
// when the new holder may already have read it as pending (with Park and a
// dead mark, that delivered the row again after later rows). Without the
// lease row lock, the takeover committed at once and the mark deleted the
// row after it.
//
// The relay releases the key once the mark has settled its only row, and
// that release, fenced by the claim, must leave the new holder's lease row
// alone. A lock on the lease row (FOR KEY SHARE, which a takeover's update
// of owner, token and epoch does not wait for, a DELETE does) holds the
// release until the takeover has committed: without it, the release could
// run between the mark's commit and the takeover's wake-up (a waiter on a
// row lock gets no priority over a newcomer once the holder has
// committed), delete the row while it was still the relay's, and leave the
// takeover nothing to update (about 1 run in 15 to 100 under -race).
func TestMarkAfterTakeoverTouchesNothing(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Postgres(t)
	ob := newOutbox(t, db)
	writeEvents(t, ob, 1, 1, 1)

	// X holds the outbox row's lock: the relay's mark will wait for it.
	x, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer x.Rollback()
	_, err = x.ExecContext(ctx, `SELECT seq FROM `+ob.Table()+` FOR UPDATE`)
	require.NoError(t, err)

	published := make(chan struct{})
	r, stop := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
		close(published)
		return nil
	}, outbox.WithLogger(quiet), outbox.WithOwner("svc"), outbox.WithPollInterval(2*time.Millisecond),
		outbox.WithLeaseDuration(time.Hour), outbox.WithListen(false))
	<-published
	// Y holds the lease row against a DELETE, not against the takeover's
	// update (see the doc above).
	y, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer y.Rollback()
	var locked string
	require.NoError(t, y.QueryRowContext(ctx, `SELECT key FROM `+ob.Table()+`_lease WHERE key = $1 FOR KEY SHARE`, key(0)).Scan(&locked))
	waitBlocked := func(what string, cond string, args ...any) {
		t.Helper()
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND `+cond, args...).Scan(&n))
			return n > 0
		}, 30*time.Second, time.Millisecond, what)
	}
	waitBlocked("the relay's mark waiting for the row lock", `query LIKE '%DELETE FROM '||$1||' %'`, ob.Table())

	// The takeover, on a connection of its own.
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	var pid int
	require.NoError(t, conn.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	tookOver := make(chan error, 1)
	go func() {
		res, err := conn.ExecContext(ctx, `UPDATE `+ob.Table()+`_lease SET owner = 'other', token = 'intruder', epoch = nextval('`+ob.Table()+`_lease_epoch') WHERE key = $1`, key(0))
		if err == nil {
			var n int64
			if n, err = res.RowsAffected(); err == nil && n != 1 {
				err = fmt.Errorf("the takeover updated %d lease rows, want 1 (the relay's lease row was gone before it)", n)
			}
		}
		tookOver <- err
	}()
	takeoverFirst := false
	require.Eventually(t, func() bool {
		select {
		case err := <-tookOver:
			require.NoError(t, err)
			takeoverFirst = true
			return true
		default:
		}
		var n int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, pid).Scan(&n))
		return n > 0 // the takeover waits for the mark's lease row lock
	}, 30*time.Second, time.Millisecond)
	pendingAtTakeover := 0
	if takeoverFirst {
		// What the new holder's fetch would read now.
		require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+ob.Table()+` WHERE state = 0`).Scan(&pendingAtTakeover))
	}
	require.NoError(t, x.Commit())
	if !takeoverFirst {
		require.NoError(t, <-tookOver)
	}
	require.Eventually(t, func() bool { st := r.Stats(); return st.Marked+st.LeasesLost > 0 }, 30*time.Second, time.Millisecond)
	// The takeover has committed: a release of the relay's that came
	// before it waits for Y, then finds the row under another claim. The
	// relay lets the key go (its release runs on the loop, which Close
	// waits for) before it is stopped, so that the release is the one
	// that settled the key, not Close's.
	var releaseWaits int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%DELETE FROM '||$1||'_lease AS l USING%'`, ob.Table()).Scan(&releaseWaits))
	require.NoError(t, y.Commit())
	require.Eventually(t, func() bool { return r.Stats().KeysHeld == 0 }, 30*time.Second, time.Millisecond)
	stop()
	st := r.Stats()
	if takeoverFirst {
		require.Equal(t, 1, pendingAtTakeover, "the new holder reads the row as pending")
		require.Zero(t, st.Marked, "the old holder's mark landed after the takeover: the row the new holder read as pending is gone")
		require.Equal(t, map[outbox.State]int64{outbox.Pending: 1}, counts(t, ob))
		require.EqualValues(t, 1, st.LeasesLost)
	} else {
		require.EqualValues(t, 1, st.Marked, "the mark held the lease row: it went first")
		require.Empty(t, counts(t, ob))
	}
	require.Equal(t, map[string]string{key(0): "intruder"}, leaseTokens(t, ob))
	t.Logf("takeover first: %v; the release waited for Y: %v", takeoverFirst, releaseWaits > 0)
}
