package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A relay whose MarkHook fails on every try holds its published rows; once
// its leases are taken over, the new holder publishes each row exactly once
// more and marks it, and the old holder's AfterMarkCommit never runs, nor
// does its hook see a row marked under the new claim.
func TestMarkHookFailingUntilTakeOverRedeliversOnceByNewHolder(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		const keys, perKey = 3, 4
		ob := newOutbox(t, db)
		writeEvents(t, ob, keys, perKey, 4)
		var mu sync.Mutex
		byTok := map[string]map[string]int{} // relay token -> event ID -> sink calls
		var aTok atomic.Value
		aTok.Store("")
		var afterA, afterB, hookSawAAfter atomic.Int32
		var takenOver atomic.Bool
		hook := func(ctx context.Context, tx *sql.Tx, m []outbox.Marked) error {
			if m[0].Claim.Token == aTok.Load().(string) {
				if takenOver.Load() {
					hookSawAAfter.Add(int32(len(m)))
				}
				outbox.AfterMarkCommit(ctx, func() { afterA.Add(1) })
				return errors.New("audit down")
			}
			outbox.AfterMarkCommit(ctx, func() { afterB.Add(int32(len(m))) })
			return nil
		}
		mk := func() *outbox.Relay {
			var r *outbox.Relay
			r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
				mu.Lock()
				defer mu.Unlock()
				tok := r.Token()
				if byTok[tok] == nil {
					byTok[tok] = map[string]int{}
				}
				byTok[tok][e.ID]++
				if tok != aTok.Load().(string) {
					takenOver.Store(true) // the new holder's claim has committed
				}
				return nil
			}, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond),
				outbox.WithRetention(time.Hour), outbox.WithMarkHook(hook))
			require.NoError(t, err)
			return r
		}
		a := mk()
		aTok.Store(a.Token())
		runRelay(t, a)
		require.Eventually(t, func() bool { return a.Stats().Published == keys*perKey && a.Stats().DBErrors >= 3 }, 30*time.Second, time.Millisecond)
		expireLeases(t, ob)
		b := mk()
		runRelay(t, b)
		require.Eventually(t, func() bool { return counts(t, ob)[outbox.Sent] == keys*perKey }, 30*time.Second, time.Millisecond)
		require.Eventually(t, func() bool { return afterB.Load() == keys*perKey }, 30*time.Second, time.Millisecond)
		require.Eventually(t, func() bool { return a.Stats().LeasesLost == keys }, 30*time.Second, time.Millisecond,
			"the old holder finds each key's lease lost at its next mark")
		waitPolls(t, a, 3)
		require.Zero(t, afterA.Load(), "the old holder's AfterMarkCommit ran")
		require.Zero(t, hookSawAAfter.Load(), "the old holder's hook saw rows after the takeover")
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, byTok[a.Token()], keys*perKey)
		require.Len(t, byTok[b.Token()], keys*perKey, "the new holder publishes every row the old one could not mark")
		for id, n := range byTok[a.Token()] {
			require.Equal(t, 1, n, "old holder published %s again", id)
		}
		for id, n := range byTok[b.Token()] {
			require.Equal(t, 1, n, "new holder published %s more than once", id)
		}
	})
}
