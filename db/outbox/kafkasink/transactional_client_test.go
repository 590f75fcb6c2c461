package kafkasink_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// Found by attacking the code (adversarial review, 2026-12-02): New took a
// transactional client (kgo.TransactionalID), on which every produce
// outside a transaction fails at once ("cannot produce record
// transactionally if not in a transaction"): the
// relay retried each event through its policy and marked it dead.
//
// New refuses a transactional client, saying why (ErrInvalidOption).
func TestNewRefusesATransactionalClient(t *testing.T) {
	_, cl := newCluster(t, []string{"t"}, kgo.TransactionalID("tx-1"))
	require.ErrorContains(t, cl.ProduceSync(context.Background(), kafkasink.Record("t", outbox.Event{Key: "k"})).FirstErr(),
		"not in a transaction", "the failure New prevents")
	_, err := kafkasink.New(cl, "t")
	require.ErrorIs(t, err, kafkasink.ErrInvalidOption)
	require.ErrorContains(t, err, "TransactionalID")
}
