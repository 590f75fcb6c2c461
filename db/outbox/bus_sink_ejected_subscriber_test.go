package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/bus"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// An event a bus subscriber accepted (queued behind the key's running
// event) is the subscriber's, not the sink's: when the running event's
// timeout ejects the subscriber (EjectAfter), the queued event never
// reaches the handler; its row is already sent, and the event reaches the
// subscriber's DeadLetters function with bus.ErrEjected and Attempts 0 (the
// limit BusSink's doc states). An event published after the ejection is
// not taken: its row stays (ErrNoSubscriber).
func TestBusSinkEventQueuedForAnEjectedSubscriberIsDeadLettered(t *testing.T) {
	ctx := context.Background()
	ob := newOutbox(t, dbtest.SQLite(t))
	b := newTestBus(t)
	handled := make(chan string, 4)
	dead := make(chan bus.DeadLetter[string], 4)
	_, err := bus.Subscribe(b, "ledger", func(ctx context.Context, env bus.Envelope[string], _ outbox.Event) error {
		handled <- env.ID
		<-ctx.Done() // the subscriber's Timeout
		return ctx.Err()
	}, bus.Timeout(50*time.Millisecond), bus.EjectAfter(1), bus.MaxConcurrency(1),
		bus.DeadLetters(func(dl bus.DeadLetter[string]) { dead <- dl }))
	require.NoError(t, err)
	first := writeOne(t, ob, "acct-1")
	queued := writeOne(t, ob, "acct-1")
	_, stop := startRelay(t, ob, outbox.BusSink(b, nil),
		outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond))
	defer stop()
	require.Equal(t, first, <-handled)
	var dls []bus.DeadLetter[string]
	for len(dls) < 2 {
		select {
		case dl := <-dead:
			dls = append(dls, dl)
		case <-time.After(30 * time.Second):
			t.Fatalf("dead letters: %d of 2", len(dls))
		}
	}
	require.Equal(t, first, dls[0].Envelope.ID)
	require.Equal(t, queued, dls[1].Envelope.ID)
	require.ErrorIs(t, dls[1].Err, bus.ErrEjected)
	require.Zero(t, dls[1].Attempts, "its handler never ran")
	require.Eventually(t, func() bool { c := counts(t, ob); return c[outbox.Pending] == 0 && c[outbox.Dead] == 0 }, 30*time.Second, 5*time.Millisecond,
		"both rows sent (deleted): the subscriber had taken them")

	later := writeOne(t, ob, "acct-1")
	require.Eventually(t, func() bool { return b.Stats().Published >= 3 }, 30*time.Second, 5*time.Millisecond)
	stop()
	select {
	case id := <-handled:
		t.Fatalf("handler ran for %s", id)
	default:
	}
	c, err := ob.Count(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), c[outbox.Pending]+c[outbox.Dead], "event %s kept", later)
}
