package kafkasink_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// Found by attacking the code (adversarial review, 2026-12-02): New took a
// topic Kafka cannot have ("bad topic", a 300-byte name), and every produce
// to it then waited for metadata that never came before failing with
// UNKNOWN_TOPIC_OR_PARTITION, an error the relay retries: each event of the
// key held it for the whole retry policy before it was marked dead.
//
// A topic name Kafka refuses (empty, over 249 bytes, "." or "..", a byte
// outside [a-zA-Z0-9._-]) is refused by New (ErrInvalidOption, naming it)
// and, from WithTopicFunc, fails the event at once with a permanent error.
func TestInvalidTopicNameIsRefused(t *testing.T) {
	_, cl := newCluster(t, []string{"t"})
	bad := []string{"bad topic", strings.Repeat("x", 250), ".", "..", "t/1", "tö", "t\x00"}
	for _, topic := range bad {
		_, err := kafkasink.New(cl, topic)
		require.ErrorIs(t, err, kafkasink.ErrInvalidOption, "%q", topic)
		require.ErrorContains(t, err, "topic")
	}
	for _, topic := range []string{strings.Repeat("x", 249), "a.b_c-D9", "..."} {
		_, err := kafkasink.New(cl, topic)
		require.NoError(t, err, "%q", topic)
	}
	for _, topic := range bad {
		sink, err := kafkasink.New(cl, "", kafkasink.WithTopicFunc(func(outbox.Event) (string, error) { return topic, nil }))
		require.NoError(t, err)
		start := time.Now()
		err = sink(context.Background(), outbox.Event{ID: "ev-1", Key: "k", Seq: 1})
		require.True(t, keysched.IsPermanent(err), "%q: %v", topic, err)
		require.ErrorContains(t, err, "ev-1")
		require.Less(t, time.Since(start), 5*time.Second, "%q refused before any produce", topic)
	}
}
