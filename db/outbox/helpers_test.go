package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

func TestMain(m *testing.M) {
	if os.Getenv(sqliteHolderEnv) != "" {
		sqliteHolderChild() // exits
	}
	if os.Getenv(pausedChildEnv) != "" {
		pausedRelayChild() // exits
	}
	dbtest.AnnounceOptOut()
	goleak.VerifyTestMain(m, dbtest.LeakOptions()...)
}

var quiet = slog.New(slog.DiscardHandler)

// newOutbox makes an outbox on a fresh table of db, with its schema.
func newOutbox(t *testing.T, db *sql.DB) *outbox.Outbox {
	t.Helper()
	ob, err := outbox.New(db, outbox.WithTable(dbtest.Table(t, db, "ob")))
	require.NoError(t, err)
	require.NoError(t, ob.CreateSchema(context.Background()))
	return ob
}

// key returns the name of key i.
func key(i int) string { return fmt.Sprintf("k%03d", i) }

// writeEvents writes perKey events for each of keys keys, index j of a key in
// its payload, in transactions of up to perTx events, interleaving keys.
func writeEvents(t testing.TB, ob *outbox.Outbox, keys, perKey, perTx int) {
	t.Helper()
	ctx := context.Background()
	var tx *sql.Tx
	n := 0
	for j := 0; j < perKey; j++ {
		for k := 0; k < keys; k++ {
			if tx == nil {
				var err error
				tx, err = ob.DB().BeginTx(ctx, nil)
				require.NoError(t, err)
			}
			_, err := ob.Write(ctx, tx, outbox.Event{Key: key(k), Type: "test", Payload: []byte(strconv.Itoa(j))})
			require.NoError(t, err)
			n++
			if n%perTx == 0 {
				require.NoError(t, tx.Commit())
				tx = nil
			}
		}
	}
	if tx != nil {
		require.NoError(t, tx.Commit())
	}
}

// recorder is a Sink that records every delivery, per key, and checks that
// no key is ever being published by two calls at once.
type recorder struct {
	mu       sync.Mutex
	byKey    map[string][]int
	ids      map[string]int // deliveries per event ID
	total    int
	want     int // distinct events expected
	done     chan struct{}
	busy     sync.Map // key -> *atomic.Int32
	overlaps atomic.Int32
}

func newRecorder(want int) *recorder {
	return &recorder{byKey: map[string][]int{}, ids: map[string]int{}, want: want, done: make(chan struct{})}
}

func (r *recorder) sink(ctx context.Context, e outbox.Event) error {
	v, _ := r.busy.LoadOrStore(e.Key, new(atomic.Int32))
	b := v.(*atomic.Int32)
	if b.Add(1) != 1 {
		r.overlaps.Add(1)
	}
	defer b.Add(-1)
	r.record(e)
	return nil
}

func (r *recorder) record(e outbox.Event) {
	j, err := strconv.Atoi(string(e.Payload))
	if err != nil {
		panic(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byKey[e.Key] = append(r.byKey[e.Key], j)
	r.ids[e.ID]++
	r.total++
	if len(r.ids) == r.want && r.want > 0 {
		select {
		case <-r.done:
		default:
			close(r.done)
		}
	}
}

// wait waits until every expected event was delivered at least once.
func (r *recorder) wait(t testing.TB, timeout time.Duration) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(timeout):
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("timed out: %d of %d events delivered", len(r.ids), r.want)
	}
}

// check asserts the strict stream model (checkStreams) and that no key was
// published by two calls at once. It returns the duplicates.
func (r *recorder) check(t testing.TB, keys, perKey int) (dups int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	dups = checkStreams(t, r.byKey, keys, perKey)
	require.Zero(t, r.overlaps.Load(), "a key was published by two calls at once")
	return dups
}

func runRelay(t *testing.T, r *outbox.Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer ccancel()
			require.NoError(t, r.Close(cctx))
			require.NoError(t, <-errc)
			cancel()
		})
	}
	t.Cleanup(stop)
	return stop
}

// fastRetry retries quickly, for tests.
var fastRetry = keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}

func counts(t testing.TB, ob *outbox.Outbox) map[outbox.State]int64 {
	t.Helper()
	c, err := ob.Count(context.Background())
	require.NoError(t, err)
	return c
}

// checkStreams asserts that every key's deliveries (event indexes, in
// delivery order) are in order with nothing skipped, and that every index
// 0..perKey-1 of keys keys arrived; it returns the duplicates. Strict (the
// stream model): each delivery is at most one past the delivery just before
// it (a redelivery restarts from an earlier event and goes on in order; two
// streams interleaved, such as 10 11 10 12, are out of order), for every
// delivery, first or not.
func checkStreams(t testing.TB, byKey map[string][]int, keys, perKey int) (dups int) {
	t.Helper()
	require.Len(t, byKey, keys, "keys delivered")
	for k, seq := range byKey {
		last, high := -1, -1
		for i, j := range seq {
			if j > last+1 {
				t.Fatalf("key %s: delivery %d is event %d after event %d: out of order or skipped (deliveries %v)", k, i, j, last, seq)
			}
			last, high = j, max(high, j)
		}
		require.Equal(t, perKey-1, high, "key %s: last event", k)
		dups += len(seq) - perKey
	}
	return dups
}

// startRelay makes a relay of ob publishing to sink and runs it (runRelay:
// stop, also called at the test's cleanup, closes it and checks that Close
// and Run returned nil).
func startRelay(t *testing.T, ob *outbox.Outbox, sink outbox.Sink, opts ...outbox.RelayOption) (r *outbox.Relay, stop func()) {
	t.Helper()
	r, err := ob.NewRelay(sink, opts...)
	require.NoError(t, err)
	return r, runRelay(t, r)
}
