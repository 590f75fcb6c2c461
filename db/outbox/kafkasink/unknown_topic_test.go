package kafkasink_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// A topic that is a valid name but not on the cluster (a typo: "ledgr" for
// "ledger") fails the sink's call with ErrUnknownTopic, naming the topic,
// the event and UNKNOWN_TOPIC_OR_PARTITION, after the check's few tries
// (about a second), not at the call's deadline with a bare "context
// deadline exceeded" (as the produce did with a client that never gives up
// on an unknown topic, kgo.UnknownTopicRetries(-1)). It is retryable. The
// existing topic's events are produced.
func TestUnknownTopicIsNamed(t *testing.T) {
	cluster, cl := newCluster(t, []string{"ledger"}, kgo.UnknownTopicRetries(-1))
	sink, err := kafkasink.New(cl, "ledgr")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e := outbox.Event{ID: "ev-1", Key: "acct-1", Seq: 7, Payload: []byte("x")}
	err = sink(ctx, e)
	require.ErrorIs(t, err, kafkasink.ErrUnknownTopic)
	require.NoError(t, ctx.Err(), "failed before the call's deadline: %v", err)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	for _, want := range []string{`"ledgr"`, "UNKNOWN_TOPIC_OR_PARTITION", "ev-1", `"acct-1"`, "kgo.AllowAutoTopicCreation"} {
		require.Contains(t, err.Error(), want)
	}
	require.False(t, keysched.IsPermanent(err), "retryable: the topic may be created")

	// A call whose context ends before the check's last try still says why.
	short, cancelShort := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancelShort()
	err = sink(short, e)
	require.ErrorIs(t, err, kafkasink.ErrUnknownTopic)
	require.Contains(t, err.Error(), `"ledgr"`)

	good, err := kafkasink.New(cl, "ledger")
	require.NoError(t, err)
	require.NoError(t, good(ctx, e))
	require.Len(t, consume(t, cluster, "ledger", 1), 1)
}

// With kgo.AllowAutoTopicCreation the sink does not check the topic: the
// produce creates it.
func TestUnknownTopicIsCreatedWithAutoTopicCreation(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.AllowAutoTopicCreation())
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	sink, err := kafkasink.New(cl, "fresh")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, sink(ctx, outbox.Event{ID: "ev-1", Key: "k", Payload: []byte("x")}))
	require.Len(t, consume(t, cluster, "fresh", 1), 1)
}

// A produce that franz-go itself fails with UNKNOWN_TOPIC_OR_PARTITION (the
// broker refusing it for a topic the metadata still lists, as for one
// deleted later) wraps ErrUnknownTopic.
func TestProduceRefusedAsUnknownTopicWrapsErrUnknownTopic(t *testing.T) {
	cluster, cl := newCluster(t, []string{"ledger"}, kgo.UnknownTopicRetries(0), kgo.RecordRetries(0))
	sink, err := kafkasink.New(cl, "ledger")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e := outbox.Event{ID: "ev-1", Key: "acct-1", Payload: []byte("x")}
	require.NoError(t, sink(ctx, e), "the check finds the topic")
	failProduce(cluster, kerr.UnknownTopicOrPartition.Code)
	err = sink(ctx, e)
	require.ErrorIs(t, err, kafkasink.ErrUnknownTopic)
	require.ErrorIs(t, err, kerr.UnknownTopicOrPartition)
	require.Contains(t, err.Error(), `"ledger"`)
}
