package kafkasink_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// Many keys' first calls for a topic not yet seen share one topic check:
// the cluster gets one metadata request at a time for the topic (at most
// the check's 5 tries in all), not one per key (16 keys made 16 or more);
// each call still fails with ErrUnknownTopic naming its own event.
func TestConcurrentFirstCallsShareOneTopicCheck(t *testing.T) {
	sink, asked := sinkToAMissingTopic(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const keys = 16
	errs := make([]error, keys)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = sink(ctx, outbox.Event{ID: fmt.Sprintf("ev-%d", i), Key: fmt.Sprintf("k%d", i), Payload: []byte("x")})
		}()
	}
	wg.Wait()
	require.NoError(t, ctx.Err(), "the check gave up after its tries")
	for i, err := range errs {
		require.ErrorIs(t, err, kafkasink.ErrUnknownTopic, "key %d", i)
		require.Contains(t, err.Error(), fmt.Sprintf("event ev-%d ", i))
	}
	require.LessOrEqual(t, asked.Load(), int64(5), "metadata requests for the topic")
	require.Positive(t, asked.Load())
}

// A call that waits for another key's check of the topic, whose context
// ends before the check's tries do, checks again with its own context: it
// gets its full tries, not the other call's verdict cut short.
func TestTopicCheckCutShortByItsCallIsAskedAgain(t *testing.T) {
	sink, asked := sinkToAMissingTopic(t)
	short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelShort()
	shortErr := make(chan error, 1)
	go func() { shortErr <- sink(short, outbox.Event{ID: "ev-short", Key: "k1", Payload: []byte("x")}) }()
	require.Eventually(t, func() bool { return asked.Load() > 0 }, 10*time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := sink(ctx, outbox.Event{ID: "ev-long", Key: "k2", Payload: []byte("x")})
	require.ErrorIs(t, err, kafkasink.ErrUnknownTopic)
	require.Contains(t, err.Error(), "asked 5 times")
	require.ErrorIs(t, <-shortErr, kafkasink.ErrUnknownTopic)
}

// sinkToAMissingTopic returns a sink to the topic "ledgr", which the cluster
// lacks (it has "ledger"; franz-go told never to give up on an unknown
// topic), and the count of metadata requests that asked for it.
func sinkToAMissingTopic(t *testing.T) (outbox.Sink, *atomic.Int64) {
	t.Helper()
	cluster, cl := newCluster(t, []string{"ledger"}, kgo.UnknownTopicRetries(-1))
	asked := new(atomic.Int64)
	cluster.ControlKey(int16(kmsg.Metadata), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		for _, rt := range kreq.(*kmsg.MetadataRequest).Topics {
			if rt.Topic != nil && *rt.Topic == "ledgr" {
				asked.Add(1)
			}
		}
		return nil, nil, false
	})
	sink, err := kafkasink.New(cl, "ledgr")
	require.NoError(t, err)
	return sink, asked
}
