package outbox_test

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// Relays with very short leases, some slow to fetch after their claims
// (more than a lease), closed or crashed and replaced while they publish: every key's
// rows go out in order (a redelivery restarts from an earlier row), no key
// is published by two calls at once, and every row is published.
func TestDrainUnderChurnWithSlowFirstFetchKeepsOrderAndLiveness(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		const keys, perKey = 6, 30
		const lease = 150 * time.Millisecond
		ob := newOutbox(t, db)
		rec := newRecorder(keys * perKey)
		sink := func(ctx context.Context, e outbox.Event) error {
			if err := rec.sink(ctx, e); err != nil {
				return err
			}
			select {
			case <-time.After(time.Millisecond):
			case <-ctx.Done():
			}
			return nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // writers: rows arrive while relays churn
			defer wg.Done()
			writeEvents(t, ob, keys, perKey, 3)
		}()
		start := func(i int) (*outbox.Relay, chan error) {
			r, err := ob.NewRelay(sink, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond),
				outbox.WithLeaseDuration(lease), outbox.WithKeyBatch(4))
			require.NoError(t, err)
			if i%3 == 1 {
				outbox.Crash(r) // its Close leaves leases and marks as a crash would
			}
			if i%2 == 0 {
				outbox.DelayFetch(r, lease*3/2)
			} else {
				outbox.DelayFetch(r, time.Duration(rand.IntN(20))*time.Millisecond)
			}
			errc := make(chan error, 1)
			go func() { errc <- r.Run(ctx) }()
			return r, errc
		}
		type live struct {
			r    *outbox.Relay
			errc chan error
		}
		var relays []live
		for i := range 3 {
			r, c := start(i)
			relays = append(relays, live{r, c})
		}
		deadline := time.After(60 * time.Second)
		tick := time.NewTicker(60 * time.Millisecond)
		defer tick.Stop()
		for i := 3; ; i++ {
			select {
			case <-rec.done:
			case <-deadline:
				rec.mu.Lock()
				n := len(rec.ids)
				rec.mu.Unlock()
				t.Fatalf("liveness: %d of %d rows published in 60 s", n, keys*perKey)
			case <-tick.C:
				// Churn: close the oldest relay, start another.
				old := relays[0]
				relays = relays[1:]
				cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = old.r.Close(cctx)
				ccancel()
				require.NoError(t, <-old.errc)
				r, c := start(i)
				relays = append(relays, live{r, c})
				continue
			}
			break
		}
		wg.Wait()
		for _, l := range relays {
			cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = l.r.Close(cctx)
			ccancel()
			require.NoError(t, <-l.errc)
		}
		dups := rec.check(t, keys, perKey)
		t.Logf("duplicates: %d", dups)
	})
}
