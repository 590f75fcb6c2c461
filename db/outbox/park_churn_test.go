package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// EnvSoak, a Go duration, makes TestParkResumeUnderRelayChurn write events
// for that long instead of its CI default (e.g. KEYSCHED_TEST_SOAK=20s, the
// scenario of issue 18).
const EnvSoak = "KEYSCHED_TEST_SOAK"

// The late-redelivery scenario, as a user would run it: three relays (two
// of one name, one of another) on 90 ms leases, each closed and restarted
// every 0.3-1.2 s; every fifth row of a key fails until it dies (the key
// parks); an operator resumes parked keys every 10 ms; events are written in
// waves meanwhile. Every delivery of a key follows the stream model (a
// redelivery restarts from an earlier row and goes on in order), and all
// arrive.
//
// Before the per-claim epoch (and the lease row lock of marks), an old
// holder's dead mark could land after a new holder had fetched and
// published the row and the ones after it: the operator's resume then had
// the row delivered again after later rows (k07: 424..428, then 421).
func TestParkResumeUnderRelayChurn(t *testing.T) {
	dur := 600 * time.Millisecond
	if s := os.Getenv(EnvSoak); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err, EnvSoak)
		dur = d
	}
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		const keys, perWave, every = 8, 2, 25 * time.Millisecond // 20 s: 12,800 events
		waves := int(dur / every)
		log := newStreamLog(keys * perWave * waves)
		var mu sync.Mutex
		calls := map[string]int{}
		strict := log.strictSink(0)
		sink := func(ctx context.Context, e outbox.Event) error {
			j, _ := strconv.Atoi(string(e.Payload))
			mu.Lock()
			calls[e.ID]++
			n := calls[e.ID]
			mu.Unlock()
			if j%5 == 2 && n <= 2 { // fails its two attempts: dead, the key parks
				return errors.New("rejected")
			}
			return strict(ctx, e)
		}
		mk := func(name string) *outbox.Relay {
			r, err := ob.NewRelay(sink, outbox.WithLogger(quiet), outbox.WithOwner(name), outbox.WithFailurePolicy(keysched.Park),
				outbox.WithPollInterval(5*time.Millisecond), outbox.WithLeaseDuration(90*time.Millisecond),
				outbox.WithBatchSize(16), outbox.WithKeyBatch(4), outbox.WithMaxKeys(4),
				outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}))
			require.NoError(t, err)
			return r
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		var resumed int
		wg.Add(1)
		go func() { // the operator
			defer wg.Done()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				parked, _ := ob.Parked(ctx)
				for _, k := range parked {
					if ob.Resume(ctx, k) == nil {
						resumed++
					}
				}
			}
		}()
		relayErrs := make(chan error, 64)
		for _, name := range []string{"svc", "svc", "other"} {
			wg.Add(1)
			go func() { // one relay slot: run, close, start again
				defer wg.Done()
				for ctx.Err() == nil {
					r := mk(name)
					errc := make(chan error, 1)
					go func() { errc <- r.Run(ctx) }()
					select {
					case <-ctx.Done():
					case <-time.After(300*time.Millisecond + rand.N(900*time.Millisecond)):
					}
					cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
					if err := r.Close(cctx); err != nil {
						relayErrs <- err
					}
					ccancel()
					// ErrClosed: ctx ended before Run started, and Close
					// came first (Run after Close returns it, as documented).
					if err := <-errc; err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, outbox.ErrClosed) {
						relayErrs <- err
					}
				}
			}()
		}
		for w := range waves { // the writer
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			for j := w * perWave; j < (w+1)*perWave; j++ {
				for k := range keys {
					_, err := ob.Write(ctx, tx, outbox.Event{Key: key(k), Type: "test", Payload: []byte(strconv.Itoa(j))})
					require.NoError(t, err)
				}
			}
			require.NoError(t, tx.Commit())
			time.Sleep(every)
		}
		log.wait(t, 60*time.Second+2*dur)
		cancel()
		wg.Wait()
		close(relayErrs)
		for err := range relayErrs {
			require.NoError(t, err)
		}
		dups := log.check(t, keys, perWave*waves)
		t.Logf("%s: %d events, %d duplicates, %d resumed", dbtest.Name(db), keys*perWave*waves, dups, resumed)
		require.Positive(t, resumed)
	})
}
