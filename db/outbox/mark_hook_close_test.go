package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

var errAuditDown = errors.New("audit down")

// Close while every mark's hook fails returns promptly and says so: an error
// counting the published rows left unmarked, wrapping the hook's error; the
// rows stay pending and the leases are released, so the next relay
// publishes them at once.
func TestMarkHookFailingAtCloseIsReportedAndBounded(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		const keys, perKey = 2, 3
		ob := newOutbox(t, db)
		writeEvents(t, ob, keys, perKey, 6)
		rec := newRecorder(keys * perKey)
		r, err := ob.NewRelay(rec.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond),
			outbox.WithMarkHook(func(ctx context.Context, tx *sql.Tx, m []outbox.Marked) error { return errAuditDown }))
		require.NoError(t, err)
		errc := make(chan error, 1)
		go func() { errc <- r.Run(context.Background()) }()
		rec.wait(t, 30*time.Second)
		require.Eventually(t, func() bool { return r.Stats().DBErrors >= 2 }, 30*time.Second, time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		err = r.Close(ctx)
		require.Less(t, time.Since(start), 9*time.Second, "Close bounded")
		require.Error(t, err)
		require.ErrorIs(t, err, errAuditDown, "Close reports the hook's error")
		require.Contains(t, err.Error(), "not marked sent")
		require.NoError(t, <-errc)
		require.Equal(t, map[outbox.State]int64{outbox.Pending: keys * perKey}, counts(t, ob))
		require.Empty(t, leaseTokens(t, ob), "leases released")

		next := newRecorder(keys * perKey)
		startRelay(t, ob, next.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond))
		next.wait(t, 30*time.Second)
		require.Zero(t, next.check(t, keys, perKey))
	})
}

// A Close whose context ends while a sink call hangs also reports the marks
// Run's shutdown could not make: the error wraps both ctx's error and the
// hook's, and says the rows were given back. It reported ctx's error alone.
func TestCloseWithAnEndedContextReportsUnmarkedRows(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		ctx := context.Background()
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		for _, k := range []string{"published", "hangs"} {
			_, err = ob.Write(ctx, tx, outbox.Event{Key: k, Payload: []byte(k)})
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
		published, hanging := make(chan struct{}), make(chan struct{})
		r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
			if e.Key == "published" {
				close(published)
				return nil
			}
			close(hanging)
			<-ctx.Done()
			return ctx.Err()
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond),
			outbox.WithMarkHook(func(ctx context.Context, tx *sql.Tx, m []outbox.Marked) error { return errAuditDown }))
		require.NoError(t, err)
		errc := make(chan error, 1)
		go func() { errc <- r.Run(context.Background()) }()
		<-published
		<-hanging
		require.Eventually(t, func() bool { return r.Stats().DBErrors >= 1 }, 30*time.Second, time.Millisecond)
		cctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		err = r.Close(cctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, errAuditDown, "Close drops what Run's shutdown could not mark")
		require.Contains(t, err.Error(), "given back")
		require.NoError(t, <-errc)
		require.Equal(t, map[outbox.State]int64{outbox.Pending: 2}, counts(t, ob))
	})
}
