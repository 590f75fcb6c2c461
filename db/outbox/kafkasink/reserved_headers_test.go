package kafkasink_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// Found by attacking the code (adversarial review, 2026-12-02): an event
// header named HeaderID ("keysched-event-id", say copied from an upstream
// record) was produced next to the sink's own, before it: a consumer taking
// the first keysched-event-id deduplicated on the upstream's ID, not the
// event's.
//
// An event with a header named HeaderID, HeaderType or HeaderSeq is refused
// with a permanent error naming the header (the row is marked dead), and
// nothing is produced.
func TestEventHeaderNamedAsTheSinksIsRefused(t *testing.T) {
	cluster, cl := newCluster(t, []string{"t"})
	var produces atomic.Int32
	cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		produces.Add(1)
		return nil, nil, false
	})
	sink, err := kafkasink.New(cl, "t")
	require.NoError(t, err)
	for _, h := range []string{kafkasink.HeaderID, kafkasink.HeaderType, kafkasink.HeaderSeq} {
		err := sink(context.Background(), outbox.Event{ID: "ev-1", Key: "k", Seq: 1, Headers: map[string]string{h: "upstream", "trace": "t"}})
		require.Error(t, err, h)
		require.True(t, keysched.IsPermanent(err), "%s: permanent: %v", h, err)
		require.ErrorIs(t, err, kafkasink.ErrReservedHeader)
		require.ErrorContains(t, err, h)
		require.ErrorContains(t, err, "ev-1")
	}
	require.Zero(t, produces.Load(), "nothing produced")
	// The same event without them goes through.
	require.NoError(t, sink(context.Background(), outbox.Event{ID: "ev-1", Key: "k", Seq: 1, Headers: map[string]string{"trace": "t"}}))
	require.EqualValues(t, 1, produces.Load())
}
