package kafkasink_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// Found by attacking the code (adversarial review, 2026-12-02): a record
// larger than the client's or the broker's maximum (a 2 MiB payload, the
// default limit being 1 MB) failed with MESSAGE_TOO_LARGE every time, but as
// a retryable error: the relay spent the whole retry policy on it (10
// attempts by default) holding its key, before marking it dead.
//
// A record too large is a permanent failure (the row is marked dead at
// once), the error naming the event, with kerr.MessageTooLarge in its chain.
func TestRecordTooLargeIsPermanent(t *testing.T) {
	_, cl := newCluster(t, []string{"t"})
	sink, err := kafkasink.New(cl, "t")
	require.NoError(t, err)
	err = sink(context.Background(), outbox.Event{ID: "ev-big", Key: "k", Seq: 1, Payload: make([]byte, 2<<20)})
	require.ErrorIs(t, err, kerr.MessageTooLarge)
	require.True(t, keysched.IsPermanent(err), "%v", err)
	require.ErrorContains(t, err, "ev-big")
}
