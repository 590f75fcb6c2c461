package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/bus"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A decode that returns a nil event and no error is a decode failure: the
// row is marked dead at once (decoding it again gives nil again), with an
// error naming the event and its key (it was retried to the end of the
// retry budget with a bare "bus: nil event").
func TestBusSinkMarksAnEventDecodedAsNilDeadAtOnce(t *testing.T) {
	ob := newOutbox(t, dbtest.SQLite(t))
	b := newTestBus(t)
	_, err := bus.Subscribe(b, "ledger", func(_ context.Context, _ bus.Envelope[string], _ deposited) error { return nil })
	require.NoError(t, err)
	id := writeOne(t, ob, "acct-1")
	_, stop := startRelay(t, ob, outbox.BusSink(b, func(outbox.Event) (any, error) { return nil, nil }),
		outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}))
	dead := waitDead(t, ob)
	stop()
	require.Equal(t, 1, dead.Attempts, "given up at once")
	for _, want := range []string{id, `"acct-1"`, "nil event"} {
		require.Contains(t, dead.Err, want)
	}
}
