package outbox_test

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// Two live relays under one WithOwner name (a restart while the old process
// still runs) both hold every key: WithOwner's contract forbids it, and
// nothing detects it: the lease query lets a relay take a live lease of its
// own name (for a fast restart), and the old process's renewals keep
// succeeding. Seen: 4 (SQLite) and 36 (PostgreSQL) sink calls overlapping
// another on the same key. A fix needs a per-process token in the lease row
// (a schema change); kept skipped as the reproduction.
func TestSameOwnerTwoLiveRelays(t *testing.T) {
	t.Skip("known limitation: two live relays with one WithOwner name publish one key at once (overlaps); a fencing token per process would be needed")
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		const keys, perKey = 4, 60
		writeEvents(t, ob, keys, perKey, 40)
		rec := newRecorder(keys * perKey)
		var mu sync.Mutex
		busy := map[string]bool{}
		var overlaps atomic.Int64
		slow := func(ctx context.Context, e outbox.Event) error {
			mu.Lock()
			if busy[e.Key] {
				overlaps.Add(1)
			}
			busy[e.Key] = true
			mu.Unlock()
			time.Sleep(2 * time.Millisecond) // widens the window; not synchronisation
			mu.Lock()
			busy[e.Key] = false
			mu.Unlock()
			rec.record(e)
			return nil
		}
		for range 2 {
			r, err := ob.NewRelay(slow, outbox.WithLogger(quiet), outbox.WithOwner("svc-1"),
				outbox.WithPollInterval(5*time.Millisecond), outbox.WithBatchSize(20), outbox.WithKeyBatch(5))
			require.NoError(t, err)
			runRelay(t, r)
		}
		rec.wait(t, 30*time.Second)
		require.Zero(t, overlaps.Load(), "a key was published by two calls at once")
	})
}
