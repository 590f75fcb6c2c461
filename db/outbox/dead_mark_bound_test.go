package outbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// The dead mark is bounded like the relay's other calls, by a third of the
// lease but at least 5 s (the package doc's "Database faults"): it was
// bounded by a third of the lease alone, so a database slower than that
// (here the row locked for 800 ms, with a 1.5 s lease) failed the mark, and
// the row, left pending, was published again with a fresh attempt budget.
func TestDeadMarkWaitsOutAStallShorterThanItsBound(t *testing.T) {
	db := dbtest.Postgres(t)
	ob := newOutbox(t, db)
	writeEvents(t, ob, 1, 1, 1)
	ctx := context.Background()
	var calls atomic.Int32
	died := make(chan outbox.DeadEvent, 1)
	r, stop := startRelay(t, ob, func(context.Context, outbox.Event) error {
		if calls.Add(1) == 1 {
			// Lock the row for 800 ms: the dead mark waits for it.
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = tx.ExecContext(ctx, `SELECT seq FROM `+ob.Table()+` FOR UPDATE`)
			require.NoError(t, err)
			time.AfterFunc(800*time.Millisecond, func() { _ = tx.Rollback() })
		}
		return keysched.Permanent(errors.New("refused"))
	}, outbox.WithLogger(quiet), outbox.WithLeaseDuration(1500*time.Millisecond), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithOnDead(func(d outbox.DeadEvent) { died <- d }))
	select {
	case <-died:
	case <-time.After(10 * time.Second):
		t.Fatalf("not marked dead: %+v", r.Stats())
	}
	stop()
	require.EqualValues(t, 1, calls.Load(), "published once, then marked dead")
	require.Zero(t, r.Stats().DBErrors)
}
