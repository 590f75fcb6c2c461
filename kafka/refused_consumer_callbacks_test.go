package kafka

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A NewConsumer refused after its client was made (a dead-letter topic that
// is also consumed) closes that client, and franz-go may have joined the
// group and assigned partitions by then: the revoke that the close runs
// must not touch the consumer that was never made. Before, it called
// ResumeFetchPartitions on its nil client: a nil pointer dereference on
// franz-go's goroutine, which no caller can recover (a fresh-user trial
// saw it within 8-73 refused calls, 4 runs of 4).
func TestRefusedConsumerIgnoresItsClientsGroupCallbacks(t *testing.T) {
	tc := newCluster(t, 4, "payments")
	h := func(context.Context, *kgo.Record) error { return nil }
	for i := range 80 {
		_, err := NewConsumer(h,
			WithClientOptions(tc.clientOpts(fmt.Sprintf("%s-%d", groupName(t), i), "payments")...),
			WithDeadLetterTopic("payments"))
		require.Error(t, err)
		require.True(t, errors.Is(err, ErrInvalidOption), "%v", err)
	}
}
