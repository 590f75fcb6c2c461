package kafkasink_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// The sink called with a nil context (directly: the relay never does)
// returns keysched.ErrNilContext naming the event; franz-go dereferenced
// it (a panic).
func TestSinkCalledWithANilContextSaysSo(t *testing.T) {
	_, cl := newCluster(t, []string{"ledger"})
	sink, err := kafkasink.New(cl, "ledger")
	require.NoError(t, err)
	var nilCtx context.Context
	err = sink(nilCtx, outbox.Event{ID: "ev-1", Key: "k", Payload: []byte("x")})
	require.ErrorIs(t, err, keysched.ErrNilContext)
	require.ErrorContains(t, err, "ev-1")
}
