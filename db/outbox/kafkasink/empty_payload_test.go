package kafkasink_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// Found by attacking the code (adversarial review, 2026-12-02): an event
// with an empty payload reached Kafka as a null value (a tombstone, which
// deletes the key on a compacted topic) from SQLite, whose empty BLOB reads
// back as nil, and as an empty value from PostgreSQL.
//
// An empty payload, nil or not when written, is produced as an empty value,
// never a null one, on both databases.
func TestEmptyPayloadIsAnEmptyValueNotATombstone(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		cluster, cl := newCluster(t, []string{"t"})
		ob, err := outbox.New(db, outbox.WithTable(dbtest.Table(t, db, "kempty")))
		require.NoError(t, err)
		require.NoError(t, ob.CreateSchema(ctx))
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		for _, p := range [][]byte{nil, {}} {
			_, err := ob.Write(ctx, tx, outbox.Event{Key: "k", Payload: p})
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
		sink, err := kafkasink.New(cl, "t")
		require.NoError(t, err)
		r, err := ob.NewRelay(sink, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond))
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- r.Run(rctx) }()
		recs := consume(t, cluster, "t", 2)
		require.NoError(t, r.Close(ctx))
		cancel()
		require.NoError(t, <-errc)
		for i, rec := range recs {
			require.NotNil(t, rec.Value, "record %d: a null value (tombstone)", i)
			require.Empty(t, rec.Value)
		}
	})
}
