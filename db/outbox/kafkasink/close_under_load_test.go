package kafkasink_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// Written to attack the code (adversarial review, 2026-12-02); it held.
//
// Relay.Close under load, the broker holding every produce for 1 s: Close
// returns within its context plus keysched.CloseGrace (a generous bound
// here), saying sink calls still run; those produces were sent, so the sink
// waits for the broker (franz-go cannot fail them safely), and once acked
// their rows are marked sent. Every sent row's record is in the topic; the
// other rows stay pending.
func TestCloseUnderLoadMarksOnlyAckedRows(t *testing.T) {
	ctx := context.Background()
	db := dbtest.SQLite(t)
	cluster, cl := newCluster(t, []string{"t"})
	var held atomic.Int32
	cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		held.Add(1)
		cluster.SleepControl(func() { time.Sleep(time.Second) })
		return nil, nil, false
	})
	ob, err := outbox.New(db)
	require.NoError(t, err)
	require.NoError(t, ob.CreateSchema(ctx))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	const keys, perKey = 10, 3
	for range perKey {
		for k := range keys {
			_, err := ob.Write(ctx, tx, outbox.Event{Key: fmt.Sprint("k", k)})
			require.NoError(t, err)
		}
	}
	require.NoError(t, tx.Commit())
	sink, err := kafkasink.New(cl, "t")
	require.NoError(t, err)
	var inFlight atomic.Int32
	r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		return sink(ctx, e)
	}, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond), outbox.WithRetention(time.Hour))
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return held.Load() > 0 && inFlight.Load() > 0 }, 20*time.Second, 5*time.Millisecond)

	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = r.Close(cctx)
	took := time.Since(start)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "still running")
	require.Less(t, took, 5*time.Second, "Close bounded by its context")
	require.NoError(t, <-errc) // once the held produces were answered

	n, err := ob.Count(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(keys*perKey), n[outbox.Sent]+n[outbox.Pending], "%v", n)
	require.Positive(t, n[outbox.Sent])
	require.Positive(t, n[outbox.Pending])
	recs := consume(t, cluster, "t", int(n[outbox.Sent]))
	require.Len(t, recs, int(n[outbox.Sent]), "every sent row's record is in the topic")
}
