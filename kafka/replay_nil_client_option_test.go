package kafka

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Replay refuses a nil client option with ErrInvalidOption naming its
// place, before making a client (franz-go dereferenced it: a panic).
func TestReplayRefusesANilClientOption(t *testing.T) {
	tc := newCluster(t, 1, "dlq")
	rep, err := Replay(context.Background(), ReplayOptions{DeadLetterTopic: "dlq"}, kgo.SeedBrokers(tc.addrs...), nil)
	require.True(t, errors.Is(err, ErrInvalidOption), "%v", err)
	require.ErrorContains(t, err, "client option 1 is nil")
	require.Nil(t, rep)
}
