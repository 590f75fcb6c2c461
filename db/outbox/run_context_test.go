package outbox_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// Run's context ending (its deadline, or its caller cancelling it) while a
// database call waits (here on a lock another transaction holds on the
// lease table) stops the relay: it is not a database failure. Before, the
// call's context error was counted (RelayStats.DBErrors, DBFailingFor) and
// logged as "database failing" at every such stop.
func TestRunContextEndIsNotADatabaseFailure(t *testing.T) {
	for _, how := range []string{"deadline", "cancel"} {
		t.Run(how, func(t *testing.T) {
			db := dbtest.Postgres(t)
			ob := newOutbox(t, db)
			writeEvents(t, ob, 1, 1, 1)
			logs := newLogLines()
			rec := newRecorder(1)
			r, err := ob.NewRelay(rec.sink, outbox.WithLogger(slog.New(logs)), outbox.WithPollInterval(10*time.Millisecond))
			require.NoError(t, err)
			defer r.Close(context.Background())
			ctx := newStopCtx(how == "deadline")
			defer ctx.stop()
			errc := make(chan error, 1)
			go func() { errc <- r.Run(ctx) }()
			rec.wait(t, 30*time.Second)

			lock, err := db.BeginTx(context.Background(), nil)
			require.NoError(t, err)
			defer lock.Rollback()
			_, err = lock.Exec(`LOCK TABLE ` + ob.Table() + `_lease IN ACCESS EXCLUSIVE MODE`)
			require.NoError(t, err)
			// The relay's next call on the lease table waits for the lock
			// (well within its own bound, callTimeout: 10 s here).
			require.Eventually(t, func() bool {
				var n int
				err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`,
					ob.Table()).Scan(&n)
				return err == nil && n > 0
			}, 30*time.Second, time.Millisecond)
			ctx.stop()
			time.Sleep(50 * time.Millisecond)   // the waiting call returns with ctx's error
			require.NoError(t, lock.Rollback()) // Run's last calls (marks, release) go through
			select {
			case err := <-errc:
				t.Logf("Run: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return")
			}
			st := r.Stats()
			require.Zero(t, st.DBErrors, "Run's own context is no database failure: %+v\n%s", st, logs.dump())
			require.Zero(t, logs.count("database failing"), logs.dump())
		})
	}
}

// stopCtx is a context that ends when stop is called, with
// context.DeadlineExceeded (its deadline passed) or context.Canceled.
type stopCtx struct {
	context.Context
	deadline bool
	done     chan struct{}
	once     sync.Once
}

func newStopCtx(deadline bool) *stopCtx {
	return &stopCtx{Context: context.Background(), deadline: deadline, done: make(chan struct{})}
}

func (c *stopCtx) stop()                 { c.once.Do(func() { close(c.done) }) }
func (c *stopCtx) Done() <-chan struct{} { return c.done }
func (c *stopCtx) Err() error {
	select {
	case <-c.done:
		if c.deadline {
			return context.DeadlineExceeded
		}
		return context.Canceled
	default:
		return nil
	}
}
