package kafka

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A revoke whose commit the broker refuses says so once in the log, with
// the partition's frontier and the broker's error, and the rebalance goes
// on: the new owner handles the partition's records again from the last
// commit (none here).
func TestRevokeThatCannotCommitSaysSoOnce(t *testing.T) {
	tc := newCluster(t, 2, "t")
	group := groupName(t)
	tc.produceSpread(t, "t", 2, 20)
	tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.UnknownServerError, Count: -1})
	logs := &logBuffer{}
	a := runMember(t, func(context.Context, *kgo.Record) error { return nil }, WithLogger(logs.logger()),
		WithCommitInterval(time.Hour), WithClientOptions(tc.clientOptsFor(protoCooperative, group, "t")...))
	eventually(t, "member a handled everything", func() bool { return a.c.Stats().Finished == 20 })
	b := runMember(t, func(context.Context, *kgo.Record) error { return nil }, WithLogger(quiet),
		WithCommitInterval(time.Hour), WithClientOptions(tc.clientOptsFor(protoCooperative, group, "t")...))
	eventually(t, "member b handled the moved partition's 10 records", func() bool { return b.c.Stats().Finished == 10 })
	l := logs.String()
	if n := strings.Count(l, "revoke: frontiers not committed"); n != 1 || !strings.Contains(l, "UNKNOWN_SERVER_ERROR") {
		t.Errorf("%d revoke lines, want 1 with the broker's error:\n%s", n, l)
	}
	for _, m := range []*member{b, a} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_ = m.c.Close(ctx) // the commits fail for good: Close says so (tested elsewhere)
		cancel()
		if err := <-m.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}
