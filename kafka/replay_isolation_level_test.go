package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Replay reads the dead-letter topic to its end whatever isolation level the
// caller's client options ask for: with kgo.FetchIsolationLevel(ReadCommitted)
// and a transaction left open in the dead-letter topic, the read stopped at
// the last stable offset, short of the end Replay waits for, and the replay
// hung until its context ended.
func TestReplayReadsToTheEndUnderReadCommitted(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	at := time.Now()
	tc.produce(t, deadLetterRec("dlq", 0, "a", "plain", at, dl("t", 0, 1, "x")))
	ctx := context.Background()
	tc.inTxn(t)(txnOpen, deadLetterRec("dlq", 0, "a", "open", at, dl("t", 0, 2, "x")))
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rep, err := Replay(rctx, ReplayOptions{DeadLetterTopic: "dlq", DryRun: true},
		append(replayOpts(tc), kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if len(rep.Records) != 1 || string(rep.Records[0].Value) != "plain" || rep.Scanned != 1 {
		t.Errorf("selected %d records (scanned %d), want plain only", len(rep.Records), rep.Scanned)
	}
}
