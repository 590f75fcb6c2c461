package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/bus"
)

// TestSucceededNeverDecreasesWhileEjecting: SubStats.Succeeded (exported by
// otelkeysched as the Counter keysched.tasks.finished{outcome=succeeded})
// never goes back, even read while an ejected subscriber's queued event is
// being dead-lettered with ErrEjected. Found by attacking the code: that
// event was counted as ejected (and subtracted from Succeeded) before its
// task returned and the scheduler counted it as succeeded, so a read from
// the dead-letter function, or a collection in that window, saw Succeeded
// drop by one (1, then 0, then 1 again): a counter reset to a backend.
func TestSucceededNeverDecreasesWhileEjecting(t *testing.T) {
	b, err := bus.New[string](bus.WithWorkers(2))
	require.NoError(t, err)
	ctx := context.Background()
	defer func() { require.NoError(t, b.Close(ctx)) }()
	var sub *bus.Subscription[string]
	during := make(chan uint64, 1)
	sub, err = bus.Subscribe(b, "x", func(ctx context.Context, _ bus.Envelope[string], e int) error {
		if e == 1 {
			<-ctx.Done() // times out: the subscriber is ejected
			return ctx.Err()
		}
		return nil
	}, bus.Timeout(20*time.Millisecond), bus.EjectAfter(1), bus.DeadLetters(func(dl bus.DeadLetter[string]) {
		if errors.Is(dl.Err, bus.ErrEjected) && dl.Envelope.Event == 2 {
			during <- sub.Stats().Succeeded // event 2 never ran: ejected
		}
	}))
	require.NoError(t, err)
	require.NoError(t, b.Publish(ctx, "k", 0))
	require.NoError(t, sub.Drain(ctx))
	require.EqualValues(t, 1, sub.Stats().Succeeded)
	require.NoError(t, b.Publish(ctx, "k", 1))
	require.NoError(t, b.Publish(ctx, "k", 2)) // queued behind 1
	require.NoError(t, sub.Drain(ctx))
	require.EqualValues(t, 1, <-during, "Succeeded went back while an ejected event was dead-lettered")
	st := sub.Stats()
	require.EqualValues(t, 1, st.Succeeded)
	require.EqualValues(t, 1, st.EjectedEvents)
	require.True(t, st.Ejected)
}
