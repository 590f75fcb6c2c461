package kafkasink_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// Found by attacking the code (adversarial review, 2026-12-02): New took a
// client made with kgo.ManualFlushing, whose records wait in its buffer
// until somebody calls Flush: the sink's produce never returned, not even
// when its context ended, so the relay's key was stuck for good.
//
// New refuses a client with manual flushing, saying why
// (ErrInvalidOption).
func TestNewRefusesAManualFlushingClient(t *testing.T) {
	_, cl := newCluster(t, []string{"t"}, kgo.ManualFlushing())
	// The hang New prevents: a produce that outlives its context.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	produced := make(chan struct{})
	cl.Produce(ctx, kafkasink.Record("t", outbox.Event{Key: "k"}), func(*kgo.Record, error) { close(produced) })
	select {
	case <-produced:
		t.Log("franz-go now fails a buffered record when its context ends")
	case <-time.After(300 * time.Millisecond):
	}
	_, err := kafkasink.New(cl, "t")
	require.ErrorIs(t, err, kafkasink.ErrInvalidOption)
	require.ErrorContains(t, err, "ManualFlushing")
}
