package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A range that ends inside a transaction committed after it (its marker
// past EndOffset, before the partition's end) reads the transaction's
// records in the range: they were committed when Replay started. Before,
// Replay --offsets 0-2 of two dead letters committed at offset 2 said "0
// dead letters read in dlq ... none selected" (ErrNothingToReplay). An
// aborted one's records stay out, and so do those of a transaction still
// open at the partition's end.
func TestReplayRangeEndingInsideACommittedTransactionReadsItsRecords(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	at := time.Now()
	ctx := context.Background()
	write := tc.inTxn(t)
	txn := func(end txnEnd, vals ...string) {
		t.Helper()
		var rs []*kgo.Record
		for i, v := range vals {
			rs = append(rs, deadLetterRec("dlq", 0, "a", v, at, dl("t", 0, int64(len(v)*10+i), "x")))
		}
		write(end, rs...)
	}
	txn(txnCommit, "c1", "c2")                                                    // offsets 0, 1; commit marker 2
	txn(txnAbort, "a1")                                                           // 3; abort marker 4
	tc.produce(t, deadLetterRec("dlq", 0, "b", "plain", at, dl("t", 0, 99, "x"))) // 5
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, c := range []struct {
		start, end int64
		want       []string
	}{
		{0, 2, []string{"c1", "c2"}},
		{1, 2, []string{"c2"}},
		{0, 0, []string{"c1", "c2", "plain"}},
		{3, 4, nil},
	} {
		rep, err := Replay(rctx, ReplayOptions{DeadLetterTopic: "dlq", DryRun: true, StartOffset: c.start, EndOffset: c.end}, replayOpts(tc)...)
		var got []string
		for _, r := range rep.Records {
			got = append(got, string(r.Value))
		}
		if len(c.want) == 0 && err == nil || len(c.want) > 0 && err != nil || len(got) != len(c.want) || rep.Scanned != len(c.want) {
			t.Errorf("offsets [%d, %d): replayed %q (scanned %d), %v; want %q", c.start, c.end, got, rep.Scanned, err, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("offsets [%d, %d): replayed %q, want %q", c.start, c.end, got, c.want)
			}
		}
	}
}
