package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/bus"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

type deposited struct{ Amount int }

// An event that no bus subscriber takes (decode returns a *deposited, the
// subscriber takes deposited) is not published: each attempt fails, naming
// the event, its key and the type, and once the retry budget is spent the
// row is dead and kept, never deleted as sent. The subscriber's handler
// never ran.
func TestBusSinkKeepsAnEventNoSubscriberTakes(t *testing.T) {
	ctx := context.Background()
	ob := newOutbox(t, dbtest.SQLite(t))
	b := newTestBus(t)
	var ran atomic.Int64
	_, err := bus.Subscribe(b, "ledger", func(context.Context, bus.Envelope[string], deposited) error {
		ran.Add(1)
		return nil
	})
	require.NoError(t, err)
	id := writeOne(t, ob, "acct-1")
	_, stop := startRelay(t, ob, outbox.BusSink(b, func(outbox.Event) (any, error) { return &deposited{Amount: 1}, nil }),
		outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}))
	dead := waitDead(t, ob)
	stop()
	require.Equal(t, 3, dead.Attempts, "retried, not given up at once")
	for _, want := range []string{id, `"acct-1"`, "*outbox_test.deposited", "no subscriber takes"} {
		require.Contains(t, dead.Err, want)
	}
	require.NoError(t, b.Drain(ctx))
	require.Zero(t, ran.Load(), "no handler ran")
}

// A relay that starts before the bus's Subscribe does not lose the events
// it reads first: they are retried and reach the subscriber once it is
// registered.
func TestBusSinkDeliversToASubscriberRegisteredLater(t *testing.T) {
	ob := newOutbox(t, dbtest.SQLite(t))
	b := newTestBus(t)
	id := writeOne(t, ob, "acct-1")
	_, stop := startRelay(t, ob, outbox.BusSink(b, func(outbox.Event) (any, error) { return deposited{Amount: 1}, nil }),
		outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 1000, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}))
	defer stop()
	require.Eventually(t, func() bool { return b.Stats().Unmatched > 0 }, 30*time.Second, time.Millisecond,
		"the relay published before any subscriber")
	got := make(chan string, 1)
	_, err := bus.Subscribe(b, "ledger", func(_ context.Context, env bus.Envelope[string], _ deposited) error {
		got <- env.ID
		return nil
	})
	require.NoError(t, err)
	select {
	case gotID := <-got:
		require.Equal(t, id, gotID)
	case <-time.After(30 * time.Second):
		t.Fatal("the event never reached the subscriber registered later")
	}
}

func newTestBus(t *testing.T) *bus.Bus[string] {
	t.Helper()
	b, err := bus.New[string](bus.WithWorkers(2), bus.WithLogger(quiet))
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	return b
}

func writeOne(t *testing.T, ob *outbox.Outbox, key string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := ob.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	id, err := ob.Write(ctx, tx, outbox.Event{Key: key, Type: "deposited", Payload: []byte("1")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	return id
}

func waitDead(t *testing.T, ob *outbox.Outbox) outbox.DeadEvent {
	t.Helper()
	var dead []outbox.DeadEvent
	require.Eventually(t, func() bool {
		var err error
		dead, err = ob.Dead(context.Background(), 10)
		require.NoError(t, err)
		return len(dead) > 0
	}, 30*time.Second, 5*time.Millisecond, "the row is marked dead")
	require.Len(t, dead, 1)
	return dead[0]
}
