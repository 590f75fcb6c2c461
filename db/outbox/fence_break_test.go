package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// streamLog records deliveries per key in the real order of their delivery
// points (one lock for all), and checks the at-least-once stream model: a
// key's deliveries are runs of consecutive events, each run starting at or
// before one past the previous delivery (a restart from an earlier row),
// never ahead of it, and every event arrives.
type streamLog struct {
	mu    sync.Mutex
	byKey map[string][]int
	ids   map[string]bool
	want  int
	done  chan struct{}
}

func newStreamLog(want int) *streamLog {
	return &streamLog{byKey: map[string][]int{}, ids: map[string]bool{}, want: want, done: make(chan struct{})}
}

// strictSink delivers only while its context is live and before its
// deadline by the monotonic clock (so a starved process whose deadline timer
// has not fired yet does not deliver late): the sink the package doc asks
// for, with no late delivery. Whatever it records must then follow the
// stream model, whatever the leases do.
func (s *streamLog) strictSink(pause time.Duration) outbox.Sink {
	return func(ctx context.Context, e outbox.Event) error {
		if pause > 0 {
			t := time.NewTimer(pause) // widens the window; not synchronisation
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		j, err := strconv.Atoi(string(e.Payload))
		if err != nil {
			return keysched.Permanent(err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if dl, ok := ctx.Deadline(); ctx.Err() != nil || (ok && !time.Now().Before(dl)) {
			return errLate
		}
		s.byKey[e.Key] = append(s.byKey[e.Key], j)
		if !s.ids[e.ID] {
			s.ids[e.ID] = true
			if len(s.ids) == s.want {
				close(s.done)
			}
		}
		return nil
	}
}

var errLate = errors.New("sink: lease deadline passed, not delivered")

func (s *streamLog) wait(t testing.TB, timeout time.Duration) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(timeout):
		s.mu.Lock()
		defer s.mu.Unlock()
		t.Fatalf("timed out: %d of %d events delivered", len(s.ids), s.want)
	}
}

func (s *streamLog) check(t testing.TB, keys, perKey int) (dups int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Len(t, s.byKey, keys)
	for k, seq := range s.byKey {
		last, high := -1, -1
		for i, j := range seq {
			if j > last+1 {
				t.Fatalf("key %s: delivery %d is event %d right after event %d: out of order (deliveries %v)", k, i, j, last, seq)
			}
			last, high = j, max(high, j)
		}
		require.Equal(t, perKey-1, high, "key %s", k)
		dups += len(seq) - perKey
	}
	return dups
}

// Three relays, two under one name and one under another, with leases so
// short that they lapse under load and keys move between the relays by
// expiry, takeover and fencing all the time. The sink delivers only before
// its lease deadline: every key's deliveries must follow the stream model
// (duplicates only as restarts from an earlier row), and all arrive.
func TestThreeRelaysShortLeasesStreamOrder(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		const keys, perKey = 8, 40
		writeEvents(t, ob, keys, perKey, 64)
		log := newStreamLog(keys * perKey)
		var stops []func()
		var relays []*outbox.Relay
		for i, name := range []string{"svc", "svc", "other"} {
			r, err := ob.NewRelay(log.strictSink(time.Duration(i)*time.Millisecond), outbox.WithLogger(quiet), outbox.WithOwner(name),
				outbox.WithPollInterval(2*time.Millisecond), outbox.WithLeaseDuration(30*time.Millisecond),
				outbox.WithBatchSize(8), outbox.WithKeyBatch(4), outbox.WithMaxKeys(4),
				outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 1 << 20, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}))
			require.NoError(t, err)
			relays = append(relays, r)
			stops = append(stops, runRelay(t, r))
		}
		log.wait(t, 40*time.Second)
		for _, stop := range stops {
			stop()
		}
		dups := log.check(t, keys, perKey)
		var lost uint64
		for _, r := range relays {
			lost += r.Stats().LeasesLost
		}
		t.Logf("%s: %d duplicates, %d leases lost", dbtest.Name(db), dups, lost)
		require.Empty(t, counts(t, ob))
	})
}
