package kafkasink_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
)

// Written to attack the code (adversarial review, 2026-12-02); it held.
//
// A row is marked sent only once the broker acknowledged its record: the
// events of key "bad" go to a broker that refuses every produce
// (INVALID_RECORD), the others to a healthy one. Every good row is sent and
// in its topic; no bad row is sent (each is dead after its attempts, with
// the sink's error naming it).
func TestRowNotAckedByTheBrokerIsNotMarkedSent(t *testing.T) {
	ctx := context.Background()
	db := dbtest.SQLite(t)
	good, goodCl := newCluster(t, []string{"t"})
	bad, badCl := newCluster(t, []string{"t"})
	var refused atomic.Int32
	bad.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		bad.KeepControl()
		refused.Add(1)
		return refuseProduce(kreq, kerr.InvalidRecord.Code), nil, true
	})
	goodSink, err := kafkasink.New(goodCl, "t")
	require.NoError(t, err)
	badSink, err := kafkasink.New(badCl, "t")
	require.NoError(t, err)
	sink := func(ctx context.Context, e outbox.Event) error {
		if e.Key == "bad" {
			return badSink(ctx, e)
		}
		return goodSink(ctx, e)
	}

	ob, err := outbox.New(db)
	require.NoError(t, err)
	require.NoError(t, ob.CreateSchema(ctx))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	const perKey = 3
	for j := range perKey {
		for _, k := range []string{"a", "bad", "b"} {
			_, err := ob.Write(ctx, tx, outbox.Event{Key: k, Payload: []byte(fmt.Sprint(j))})
			require.NoError(t, err)
		}
	}
	require.NoError(t, tx.Commit())
	r, err := ob.NewRelay(sink, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithRetention(time.Hour), // keep sent rows, to count them
		outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}))
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	recs := consume(t, good, "t", 2*perKey)
	deadline := time.Now().Add(20 * time.Second)
	var n map[outbox.State]int64
	for {
		n, err = ob.Count(ctx)
		require.NoError(t, err)
		if n[outbox.Sent] == 2*perKey && n[outbox.Dead] == perKey || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, r.Close(ctx))
	require.NoError(t, <-errc)
	require.Equal(t, map[outbox.State]int64{outbox.Sent: 2 * perKey, outbox.Dead: perKey}, n)
	for _, rec := range recs {
		require.NotEqual(t, "bad", string(rec.Key))
	}
	require.Positive(t, refused.Load())
	dead, err := ob.Dead(ctx, 10)
	require.NoError(t, err)
	for _, d := range dead {
		require.Equal(t, "bad", d.Key)
		require.True(t, strings.Contains(d.Err, d.ID) && strings.Contains(d.Err, "INVALID_RECORD"), d.Err)
	}
}
