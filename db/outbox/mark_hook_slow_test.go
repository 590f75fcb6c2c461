package outbox_test

import (
	"context"
	"database/sql"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A MarkHook slower than the lease (it ignores its context) holds its mark
// transaction, and the lease rows it locks, past the lease while another
// relay runs: every key's rows still go out in order, never by two calls at
// once, and every row is published and marked.
func TestMarkHookSlowerThanTheLeaseKeepsOrder(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		const keys, perKey = 3, 20
		const lease = 300 * time.Millisecond
		ob := newOutbox(t, db)
		writeEvents(t, ob, keys, perKey, 10)
		rec := newRecorder(keys * perKey)
		var slow atomic.Int32
		opts := []outbox.RelayOption{outbox.WithLogger(quiet), outbox.WithPollInterval(5 * time.Millisecond),
			outbox.WithLeaseDuration(lease), outbox.WithKeyBatch(5)}
		startRelay(t, ob, rec.sink, append(opts, outbox.WithMarkHook(func(ctx context.Context, tx *sql.Tx, m []outbox.Marked) error {
			if slow.Add(1) <= 2 {
				time.Sleep(3 * lease)
			}
			return nil
		}))...)
		require.Eventually(t, func() bool { return slow.Load() >= 1 }, 30*time.Second, time.Millisecond, "the slow hook runs")
		startRelay(t, ob, rec.sink, opts...)
		rec.wait(t, 60*time.Second)
		require.Eventually(t, func() bool { return len(counts(t, ob)) == 0 }, 60*time.Second, 5*time.Millisecond)
		dups := rec.check(t, keys, perKey)
		t.Logf("duplicates: %d", dups)
	})
}
