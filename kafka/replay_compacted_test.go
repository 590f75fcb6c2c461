package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A compacted dead-letter topic has gaps: the record at the end of the
// offset range asked for may be gone. Replay stops reading a partition at
// the first record at or past the range's end: it waited for the missing
// offset until its context ended (here: --offsets 0-1 after compaction
// removed offset 1, a dead letter superseded by one of the same key).
func TestReplayReadsACompactedDeadLetterTopicToTheEndOfItsRange(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tc.addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	rr := kmsg.NewIncrementalAlterConfigsRequestResource()
	rr.ResourceType, rr.ResourceName = kmsg.ConfigResourceTypeTopic, "dlq"
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value = "cleanup.policy", kmsg.StringPtr("compact")
	rr.Configs = append(rr.Configs, c)
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(resp.Resources[0].ErrorCode); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	for i, k := range []string{"x", "a", "b", "a", "c"} { // one batch each
		tc.produce(t, deadLetterRec("dlq", 0, k, k, at, dl("t", 0, int64(i), "x")))
	}
	tc.Compact()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rep, err := Replay(rctx, ReplayOptions{DeadLetterTopic: "dlq", EndOffset: 2, DryRun: true}, replayOpts(tc)...)
	if err != nil || rep.Scanned != 1 || len(rep.Records) != 1 || string(rep.Records[0].Value) != "x" {
		t.Fatalf("replay of [0, 2) after offset 1 was compacted away: %v (report %+v), want x alone", err, rep)
	}
	rep, err = Replay(rctx, ReplayOptions{DeadLetterTopic: "dlq", DryRun: true}, replayOpts(tc)...)
	if err != nil || rep.Scanned != 4 {
		t.Fatalf("replay of the whole topic: %v, scanned %d, want 4 (offset 1 compacted away)", err, rep.Scanned)
	}
}
