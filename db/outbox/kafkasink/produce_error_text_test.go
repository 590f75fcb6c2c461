package kafkasink_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// Found by attacking the code (adversarial review, 2026-12-02): a failed
// produce returned franz-go's error alone ("INVALID_RECORD: This record has
// failed the validation..."), which the relay logs and stores as the dead
// row's error: nothing said which event, key or topic.
//
// A failed produce says what it could not do: the event's ID, key and seq,
// and the topic; the broker's error stays in the chain (errors.Is).
func TestProduceErrorNamesTheEventAndTopic(t *testing.T) {
	cluster, cl := newCluster(t, []string{"orders"})
	failProduce(cluster, kerr.InvalidRecord.Code)
	sink, err := kafkasink.New(cl, "orders")
	require.NoError(t, err)
	err = sink(context.Background(), outbox.Event{ID: "ev-7", Key: "acct-3", Seq: 42})
	require.ErrorIs(t, err, kerr.InvalidRecord)
	for _, want := range []string{"kafkasink: produce", "ev-7", `"acct-3"`, "42", `"orders"`, "INVALID_RECORD"} {
		require.ErrorContains(t, err, want)
	}
}
