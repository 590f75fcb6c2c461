package kafkasink_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// A call whose own context ends while it waits for another key's check of
// its topic says that the check was pending (it got a bare context error
// from the produce): once the cluster answered that it lacks the topic, the
// error wraps ErrUnknownTopic; before any answer, it says none came. Both
// wrap the call's context error.
func TestCallEndedWhileAnotherKeysTopicCheckIsPendingSaysSo(t *testing.T) {
	t.Run("after an answer", func(t *testing.T) {
		sink, asked := sinkToAMissingTopic(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		first := make(chan error, 1)
		go func() { first <- sink(ctx, outbox.Event{ID: "ev-1", Key: "k1", Payload: []byte("x")}) }()
		// The second request is made once the first was answered.
		require.Eventually(t, func() bool { return asked.Load() >= 2 }, 10*time.Second, time.Millisecond)
		short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancelShort()
		err := sink(short, outbox.Event{ID: "ev-2", Key: "k2", Payload: []byte("x")})
		t.Log(err)
		require.ErrorIs(t, err, kafkasink.ErrUnknownTopic)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Contains(t, err.Error(), "event ev-2 ")
		require.Contains(t, err.Error(), "another key's call")
		require.ErrorIs(t, <-first, kafkasink.ErrUnknownTopic)
	})
	t.Run("before any answer", func(t *testing.T) {
		cluster, cl := newCluster(t, []string{"ledger"}, kgo.UnknownTopicRetries(-1))
		release := make(chan struct{})
		var released atomic.Bool
		held := make(chan struct{}, 1)
		cluster.ControlKey(int16(kmsg.Metadata), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
			if released.Load() {
				// No slept control after the release: one still beginning
				// when the cluster closed left kfake's goroutine behind
				// (goleak, seen once in CI).
				return nil, nil, false
			}
			cluster.KeepControl()
			for _, rt := range kreq.(*kmsg.MetadataRequest).Topics {
				if rt.Topic != nil && *rt.Topic == "ledgr" {
					select {
					case held <- struct{}{}:
					default:
					}
					cluster.SleepControl(func() { <-release })
				}
			}
			return nil, nil, false
		})
		sink, err := kafkasink.New(cl, "ledgr")
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		first := make(chan error, 1)
		go func() { first <- sink(ctx, outbox.Event{ID: "ev-1", Key: "k1", Payload: []byte("x")}) }()
		<-held
		short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancelShort()
		err = sink(short, outbox.Event{ID: "ev-2", Key: "k2", Payload: []byte("x")})
		t.Log(err)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NotErrorIs(t, err, kafkasink.ErrUnknownTopic)
		require.Contains(t, err.Error(), "event ev-2 ")
		require.Contains(t, err.Error(), "check of the topic was pending")
		released.Store(true)
		close(release)
		cancel()
		<-first
	})
}
