package kafkasink_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// Written to attack the code (adversarial review, 2026-12-02); it held.
//
// Each key's events land in its partition in write order, once each, across
// both kinds of retry: franz-go's own (the broker answers
// NOT_LEADER_FOR_PARTITION, or closes the connection without answering) and
// the relay's (the broker refuses a produce with INVALID_RECORD, a sink
// error). The faults hit the first produce requests, then every fifth.
func TestOrderPerKeyAcrossRetries(t *testing.T) {
	ctx := context.Background()
	db := dbtest.SQLite(t)
	cluster, cl := newCluster(t, []string{"t"},
		kgo.RetryBackoffFn(func(int) time.Duration { return 5 * time.Millisecond }),
		kgo.MetadataMinAge(10*time.Millisecond))
	var n atomic.Int32
	var faults [3]atomic.Int32
	cluster.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		i := n.Add(1)
		if i > 3 && i%5 != 0 {
			return nil, nil, false
		}
		switch f := i % 3; f {
		case 0:
			faults[f].Add(1)
			return refuseProduce(kreq, kerr.NotLeaderForPartition.Code), nil, true
		case 1:
			faults[f].Add(1)
			return nil, errors.New("connection dropped"), true
		default:
			faults[f].Add(1)
			return refuseProduce(kreq, kerr.InvalidRecord.Code), nil, true
		}
	})
	ob, err := outbox.New(db)
	require.NoError(t, err)
	require.NoError(t, ob.CreateSchema(ctx))
	const keys, perKey = 6, 6
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	for j := range perKey {
		for k := range keys {
			_, err := ob.Write(ctx, tx, outbox.Event{Key: fmt.Sprint("k", k), Payload: []byte(strconv.Itoa(j))})
			require.NoError(t, err)
		}
	}
	require.NoError(t, tx.Commit())
	sink, err := kafkasink.New(cl, "t")
	require.NoError(t, err)
	var sinkErrs atomic.Int32
	r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		err := sink(ctx, e)
		if err != nil {
			sinkErrs.Add(1)
		}
		return err
	}, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 20, InitialBackoff: time.Millisecond}))
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	recs := consume(t, cluster, "t", keys*perKey)
	require.NoError(t, r.Close(ctx))
	require.NoError(t, <-errc)

	byKey := map[string][]int{}
	for _, rec := range recs {
		j, err := strconv.Atoi(string(rec.Value))
		require.NoError(t, err)
		byKey[string(rec.Key)] = append(byKey[string(rec.Key)], j)
	}
	want := make([]int, perKey)
	for i := range want {
		want[i] = i
	}
	for k, got := range byKey {
		require.Equal(t, want, got, "key %s", k)
	}
	require.Len(t, byKey, keys)
	for f := range faults {
		require.Positive(t, faults[f].Load(), "fault %d injected", f)
	}
	require.Positive(t, sinkErrs.Load(), "the relay retried")
	c, err := ob.Count(ctx)
	require.NoError(t, err)
	require.Empty(t, c, "every row sent (and deleted)")
}
