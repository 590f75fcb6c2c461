package outbox

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
)

// Under Park a dead row stops its key for every relay. Relay A holds key k
// and its sink fails row 0 for good; A's lease has ended in the database by
// the time A marks the row dead (as when A's UPDATE waited for the database
// past the lease's end after A checked its deadline: A's own deadline is
// far here, so that A does mark). Relay B's claim walk saw k free (lease
// expired, no dead row yet); A's mark lands; then B claims k. Before the
// fix B then published rows 1, 2, ... of k past the dead row 0: a later row
// out before an earlier one, on a parked key. Now a Park relay fetches
// nothing of a key with a dead row, whenever the row died.
func TestParkDeadRowMarkedBetweenWalkAndClaim(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		o, err := New(db, WithTable(dbtest.Table(t, db, "ob")))
		require.NoError(t, err)
		require.NoError(t, o.CreateSchema(ctx))
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		for j := range 4 {
			_, err := o.Write(ctx, tx, Event{Key: "k", Payload: []byte(strconv.Itoa(j))})
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
		quiet := slog.New(slog.DiscardHandler)
		opts := []RelayOption{WithLogger(quiet), WithPollInterval(5 * time.Millisecond), WithLeaseDuration(time.Hour),
			WithFailurePolicy(keysched.Park), WithRetry(keysched.RetryPolicy{MaxAttempts: 1})}

		calling, fail := make(chan struct{}), make(chan struct{})
		a, err := o.NewRelay(func(ctx context.Context, e Event) error {
			close(calling)
			<-fail
			return keysched.Permanent(errors.New("rejected"))
		}, opts...)
		require.NoError(t, err)
		aCtx, aCancel := context.WithCancel(ctx)
		aDone := make(chan error, 1)
		go func() { aDone <- a.Run(aCtx) }()
		<-calling // A holds k and publishes row 0
		// A's lease ends in the database (A itself still thinks it holds k).
		expire := `UPDATE ` + o.Table() + `_lease SET expires_at = 0`
		if o.Dialect() == Postgres {
			expire = `UPDATE ` + o.Table() + `_lease SET expires_at = now() - interval '1 second'`
		}
		_, err = db.ExecContext(ctx, expire)
		require.NoError(t, err)

		var mu sync.Mutex
		var published []string
		b, err := o.NewRelay(func(ctx context.Context, e Event) error {
			mu.Lock()
			published = append(published, string(e.Payload))
			mu.Unlock()
			return nil
		}, opts...)
		require.NoError(t, err)
		var once sync.Once
		hooked := make(chan struct{})
		b.afterWalk = func(found []string) {
			if len(found) == 0 {
				return
			}
			once.Do(func() {
				defer close(hooked)
				close(fail) // A's sink fails for good; A marks row 0 dead
				for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
					if c, err := o.Count(ctx); err == nil && c[Dead] == 1 {
						return
					}
					runtime.Gosched()
				}
				t.Error("A did not mark row 0 dead")
			})
		}
		bCtx, bCancel := context.WithCancel(ctx)
		bDone := make(chan error, 1)
		go func() { bDone <- b.Run(bCtx) }()
		select {
		case <-hooked:
		case <-time.After(30 * time.Second):
			t.Fatal("B's walk never found k free")
		}
		polls := b.Stats().Polls
		require.Eventually(t, func() bool { return b.Stats().Polls >= polls+5 }, 30*time.Second, time.Millisecond)
		bCancel()
		require.ErrorIs(t, <-bDone, context.Canceled)
		aCancel()
		require.ErrorIs(t, <-aDone, context.Canceled)
		c, err := o.Count(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, c[Dead], "row 0 is dead: the walk-then-claim interleaving did not happen")
		mu.Lock()
		defer mu.Unlock()
		require.Empty(t, published, "a relay published rows of a parked key past its dead row")
		require.EqualValues(t, 3, c[Pending])
	})
}
