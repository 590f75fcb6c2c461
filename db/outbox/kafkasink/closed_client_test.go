package kafkasink_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// Found by attacking the code (adversarial review, 2026-12-02): a client
// closed before the relay (the shutdown order the package doc warns
// against) failed every produce at once with kgo.ErrClientClosed, so the
// relay spent each row's attempts in a row and marked it dead within the
// retry policy's delays, waiting for an operator's Resume though none was
// ever published.
//
// A sink whose client is closed snoozes (no attempt spent): each row is
// tried again and again, and stays pending; none is marked dead. The
// relay still closes.
func TestClosedClientLeavesRowsPending(t *testing.T) {
	ctx := context.Background()
	db := dbtest.SQLite(t)
	_, cl := newCluster(t, []string{"t"})
	ob, err := outbox.New(db)
	require.NoError(t, err)
	require.NoError(t, ob.CreateSchema(ctx))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	for k := 0; k < 3; k++ {
		_, err := ob.Write(ctx, tx, outbox.Event{Key: fmt.Sprint("k", k)})
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
	sink, err := kafkasink.New(cl, "t")
	require.NoError(t, err)
	cl.Close()

	var mu sync.Mutex
	calls := map[string]int{}
	tried := make(chan struct{})
	var once sync.Once
	counting := func(ctx context.Context, e outbox.Event) error {
		err := sink(ctx, e)
		mu.Lock()
		calls[e.ID]++
		if calls[e.ID] == 3 {
			once.Do(func() { close(tried) })
		}
		mu.Unlock()
		return err
	}
	// Two attempts, 1 ms apart: without the snooze a row is dead after its
	// second call, and none gets a third.
	r, err := ob.NewRelay(counting, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}))
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	select {
	case <-tried:
	case <-time.After(20 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("no row called 3 times in 20 s: %v", calls)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, r.Close(cctx))
	require.NoError(t, <-errc)
	n, err := ob.Count(ctx)
	require.NoError(t, err)
	require.Equal(t, map[outbox.State]int64{outbox.Pending: 3}, n)
}
