package outbox_test

import (
	"context"
	"database/sql"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// leaseRows counts the outbox's lease rows.
func leaseRows(t *testing.T, db *sql.DB, ob *outbox.Outbox) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM `+ob.Table()+`_lease`).Scan(&n))
	return n
}

// claimSink records each delivery's payload and claim epoch.
type claimSink struct {
	mu     sync.Mutex
	epochs map[string]int64 // payload -> the claim's epoch
	got    chan string
}

func newClaimSink() *claimSink {
	return &claimSink{epochs: map[string]int64{}, got: make(chan string, 100)}
}

func (s *claimSink) sink(ctx context.Context, e outbox.Event) error {
	c, _ := outbox.ClaimFrom(ctx)
	s.mu.Lock()
	s.epochs[string(e.Payload)] = c.Epoch
	s.mu.Unlock()
	s.got <- string(e.Payload)
	return nil
}

func (s *claimSink) wait(t *testing.T, payload string, within time.Duration) int64 {
	t.Helper()
	select {
	case p := <-s.got:
		require.Equal(t, payload, p)
	case <-time.After(within):
		t.Fatalf("%s not delivered within %v", payload, within)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epochs[payload]
}

// A key that drains (its rows published and marked) keeps its lease for
// the linger (ten poll intervals): its next row, written meanwhile, goes out
// under the same claim (same epoch: no release, no new claim, no commit for
// either), and the key is released once it has stayed drained for the
// linger. Before, the key was released at the first poll that found it
// drained and claimed afresh (a new epoch) for the next row.
func TestDrainedKeyLingersThenIsReleased(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		s := newClaimSink()
		// Linger: 1.5 s. The hour's lease keeps the key from being let go
		// for having been fetched from for a lease (draining).
		const poll = 150 * time.Millisecond
		r, _ := startRelay(t, ob, s.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(poll),
			outbox.WithLeaseDuration(time.Hour))
		commitEvent(t, ob, "k", "0")
		e0 := s.wait(t, "0", 30*time.Second)
		waitUntil(t, "row 0 marked", func() bool { return len(counts(t, ob)) == 0 })
		// Polls that found the key drained: before, the first released it.
		p := r.Stats().Polls
		waitUntil(t, "two more polls", func() bool { return r.Stats().Polls >= p+2 })
		require.Equal(t, 1, leaseRows(t, db, ob), "the drained key's lease, within the linger")
		commitEvent(t, ob, "k", "1")
		e1 := s.wait(t, "1", 30*time.Second)
		require.Equal(t, e0, e1, "the row after the drain went out under a new claim")
		// Drained for the linger: released (any relay may claim it now).
		waitUntil(t, "key released after the linger", func() bool {
			return r.Stats().KeysHeld == 0 && leaseRows(t, db, ob) == 0
		})
	})
}

// A relay at its key limit (WithMaxKeys) whose keys all linger gives a
// lingering key's slot to a key that waits, at once rather than after the
// linger; Close releases the lingering keys' leases.
func TestRelayAtKeyLimitGivesLingeringSlotToWaitingKey(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		s := newClaimSink()
		// Linger: ten polls, 10 s (a third of the 90 s lease is more).
		r, stop := startRelay(t, ob, s.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(time.Second),
			outbox.WithLeaseDuration(90*time.Second), outbox.WithMaxKeys(1))
		commitEvent(t, ob, "a", "a0")
		s.wait(t, "a0", 30*time.Second)
		waitUntil(t, "a0 marked", func() bool { return len(counts(t, ob)) == 0 })
		commitEvent(t, ob, "b", "b0")
		s.wait(t, "b0", 5*time.Second) // a poll interval, far below the linger
		require.Equal(t, 1, r.Stats().KeysHeld)
		waitUntil(t, "b0 marked", func() bool { return len(counts(t, ob)) == 0 })
		require.Equal(t, 1, leaseRows(t, db, ob), "b lingers")
		stop()
		require.Zero(t, leaseRows(t, db, ob), "Close left a lingering key's lease")
	})
}

// A relay whose batch is full (no room to fetch) releases its lingering
// keys at once: it cannot serve them, and another relay can.
func TestRelayWithoutRoomReleasesLingeringKeys(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		started, unblock := make(chan struct{}), make(chan struct{})
		defer close(unblock)
		var once sync.Once
		a, _ := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
			if e.Key != "slow" {
				return nil
			}
			once.Do(func() { close(started) })
			select { // holds the relay's one slot
			case <-unblock:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(time.Second), outbox.WithLeaseDuration(90*time.Second),
			outbox.WithBatchSize(1), outbox.WithMaxKeys(2))
		commitEvent(t, ob, "b", "b0")
		waitUntil(t, "b0 published and marked", func() bool { return a.Stats().Marked == 1 })
		require.Equal(t, 1, a.Stats().KeysHeld, "b lingers")
		commitEvent(t, ob, "slow", "s0")
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the slow key's row never started")
		}
		// a's batch is full: it lets b go, well before the 10 s linger.
		require.Eventually(t, func() bool { return a.Stats().KeysHeld == 1 }, 5*time.Second, 5*time.Millisecond,
			"a relay with no room kept its lingering key")
		s := newClaimSink()
		other, _ := startRelay(t, ob, s.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(20*time.Millisecond))
		commitEvent(t, ob, "b", "b1")
		s.wait(t, "b1", 30*time.Second)
		require.Equal(t, 1, other.Stats().KeysHeld)
	})
}

// A steady stream of rows, 15 ms apart, does not make the
// relay tell writers to notify it between two rows (each notifying commit
// takes PostgreSQL's server-wide notify lock): a poll that finds nothing
// just after one that found rows is followed by another look, not by the
// idle row. Before, with drained keys lingering, the relay went idle between
// most rows (161 idle rows in an outboxbench run of 20,000 events).
func TestSteadyStreamDoesNotMakeWritersNotify(t *testing.T) {
	db := dbtest.Postgres(t)
	ob := newOutbox(t, db)
	const rows = 100
	rec := newRecorder(rows)
	r, _ := startRelay(t, ob, rec.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(20*time.Millisecond))
	waitUntil(t, "relay idle", func() bool { return outbox.Idle(r) })
	// A gap between two commits longer than IdleConfirm (a loaded
	// machine) is idleness the relay may rightly announce: each such gap
	// allows one notification more, and a run with mostly such gaps
	// measures nothing.
	long := 0
	last := time.Now()
	for i := range rows {
		commitEvent(t, ob, key(0), strconv.Itoa(i))
		if now := time.Now(); i > 0 && now.Sub(last) > outbox.IdleConfirm {
			long++
		}
		last = time.Now()
		// 15 ms apart: a relay that went idle whenever a poll found
		// nothing (without the look within IdleConfirm of rows) made the
		// writers notify at 129-143 of 150 such rows; at 2 ms apart at
		// 3-17, which no bound tells from the 1-13 of a correct relay.
		time.Sleep(15 * time.Millisecond)
	}
	rec.wait(t, 30*time.Second)
	n := r.Stats().Notifications
	t.Logf("notifications: %d for %d rows, %d gaps between commits longer than %v", n, rows, long, outbox.IdleConfirm)
	if long > rows/2 {
		t.Skipf("machine too loaded to hold a steady stream: %d of %d gaps between commits longer than %v", long, rows-1, outbox.IdleConfirm)
	}
	require.LessOrEqual(t, n, uint64(rows/10+long), "writers notified the relay between the rows of a steady stream")
}
