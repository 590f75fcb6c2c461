package kafkasink_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

func TestMain(m *testing.M) {
	dbtest.AnnounceOptOut()
	goleak.VerifyTestMain(m, dbtest.LeakOptions()...)
}

var quiet = slog.New(slog.DiscardHandler)

// Events written to the outbox reach Kafka through the relay and the sink:
// every one, each key's in write order within its partition, with the event
// ID, type and seq in the headers. Runs on an in-process kfake cluster.
func TestRelayToKafka(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "orders"))
		require.NoError(t, err)
		defer cluster.Close()
		producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
		require.NoError(t, err)
		defer producer.Close()

		ob, err := outbox.New(db, outbox.WithTable(dbtest.Table(t, db, "kob")))
		require.NoError(t, err)
		require.NoError(t, ob.CreateSchema(ctx))
		const keys, perKey = 20, 15
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		ids := map[string]bool{}
		for j := 0; j < perKey; j++ {
			for k := 0; k < keys; k++ {
				id, err := ob.Write(ctx, tx, outbox.Event{Key: fmt.Sprint("acct-", k), Type: "deposit", Payload: []byte(strconv.Itoa(j)),
					Headers: map[string]string{"trace": "t"}})
				require.NoError(t, err)
				ids[id] = true
			}
		}
		// One event whose topic cannot be chosen: dead, not lost.
		_, err = ob.Write(ctx, tx, outbox.Event{Key: "bad", Type: "unroutable", Payload: []byte("0")})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())

		sink, err := kafkasink.New(producer, "", kafkasink.WithTopicFunc(func(e outbox.Event) (string, error) {
			if e.Type == "unroutable" {
				return "", errors.New("no topic for this type")
			}
			return "orders", nil
		}))
		require.NoError(t, err)
		r, err := ob.NewRelay(sink, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond))
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- r.Run(rctx) }()

		consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("orders"),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		require.NoError(t, err)
		defer consumer.Close()
		byKey := map[string][]int{}
		got := 0
		fctx, fcancel := context.WithTimeout(ctx, 60*time.Second)
		defer fcancel()
		for got < keys*perKey {
			fs := consumer.PollFetches(fctx)
			require.NoError(t, fctx.Err(), "timed out with %d of %d records", got, keys*perKey)
			fs.EachRecord(func(rec *kgo.Record) {
				got++
				j, err := strconv.Atoi(string(rec.Value))
				require.NoError(t, err)
				byKey[string(rec.Key)] = append(byKey[string(rec.Key)], j)
				h := map[string]string{}
				for _, x := range rec.Headers {
					h[x.Key] = string(x.Value)
				}
				require.True(t, ids[h[kafkasink.HeaderID]], "record carries its event ID")
				require.Equal(t, "deposit", h[kafkasink.HeaderType])
				require.Equal(t, "t", h["trace"])
				require.NotEmpty(t, h[kafkasink.HeaderSeq])
			})
		}
		require.NoError(t, r.Close(ctx))
		cancel()
		require.NoError(t, <-errc)
		require.Len(t, byKey, keys)
		for k, js := range byKey {
			want := make([]int, perKey)
			for i := range want {
				want[i] = i
			}
			require.Equal(t, want, js, "key %s in order", k)
		}
		dead, err := ob.Dead(ctx, 10)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		require.Equal(t, "bad", dead[0].Key)
		require.Contains(t, dead[0].Err, "no topic for this type")
	})
}

func TestNewErrors(t *testing.T) {
	_, err := kafkasink.New(nil, "t")
	require.ErrorIs(t, err, kafkasink.ErrInvalidOption)
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	require.NoError(t, err)
	defer cl.Close()
	_, err = kafkasink.New(cl, "")
	require.ErrorIs(t, err, kafkasink.ErrInvalidOption)
	_, err = kafkasink.New(cl, "t", nil)
	require.ErrorIs(t, err, kafkasink.ErrInvalidOption)
	_, err = kafkasink.New(cl, "t", kafkasink.WithTopicFunc(nil))
	require.ErrorIs(t, err, kafkasink.ErrInvalidOption)
}
