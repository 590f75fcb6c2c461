package kafkasink_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// Found by attacking the code (adversarial review, 2026-12-02): New took a
// client made with kgo.RequiredAcks(kgo.NoAck()), whose ProduceSync returns
// nil once the record is written to the socket: on a kfake broker that
// dropped every produce request, the sink returned nil, so the relay would
// have marked the event sent though no broker had it.
//
// New refuses a client that does not wait for the brokers' acknowledgement,
// naming the option; the leader's and all in-sync replicas' acks are taken.
func TestNewRefusesAClientThatDoesNotWaitForAcks(t *testing.T) {
	_, noAck := newCluster(t, []string{"t"}, kgo.RequiredAcks(kgo.NoAck()), kgo.DisableIdempotentWrite())
	_, err := kafkasink.New(noAck, "t")
	require.ErrorIs(t, err, kafkasink.ErrInvalidOption)
	require.ErrorContains(t, err, "NoAck")
	for _, acks := range []kgo.Acks{kgo.LeaderAck(), kgo.AllISRAcks()} {
		opts := []kgo.Opt{kgo.RequiredAcks(acks)}
		if acks == kgo.LeaderAck() {
			opts = append(opts, kgo.DisableIdempotentWrite()) // franz-go requires it
		}
		_, cl := newCluster(t, []string{"t"}, opts...)
		_, err := kafkasink.New(cl, "t")
		require.NoError(t, err)
	}
}
