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

// A revoke whose commit the broker applied but answered REQUEST_TIMED_OUT
// (kfake applies the commit, then answers with the fault's error, as a
// broker whose answer timed out may): the revoke reads the group's offsets
// back, as Close does, and says nothing about frontiers not committed; the
// moved partition's frontier is on the broker, so the new owner starts
// there.
func TestRevokeDoesNotReportACommitTheBrokerApplied(t *testing.T) {
	tc := newCluster(t, 2, "t")
	group := groupName(t)
	tc.produceSpread(t, "t", 2, 20)
	f := tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.RequestTimedOut, Count: -1})
	logs := &logBuffer{}
	a := runMember(t, func(context.Context, *kgo.Record) error { return nil }, WithLogger(logs.logger()),
		WithCommitInterval(time.Hour), WithRevokeTimeout(2*time.Second), WithClientOptions(tc.clientOptsFor(protoCooperative, group, "t")...))
	eventually(t, "member a handled everything", func() bool { return a.c.Stats().Finished == 20 })
	b := runMember(t, func(context.Context, *kgo.Record) error { return nil }, WithLogger(quiet),
		WithCommitInterval(time.Hour), WithClientOptions(tc.clientOptsFor(protoCooperative, group, "t")...))
	eventually(t, "a partition moved to member b, a's revoke done", func() bool {
		return len(b.c.owned()) == 1 && len(a.c.owned()) == 1 && f.Hits() >= 1
	})
	moved := b.c.owned()[0].id
	if off := tc.committedOffset(t, group, "t", moved); off != 10 {
		t.Errorf("partition %d: the broker holds %d, want 10 (the revoke's commit applied)", moved, off)
	}
	if l := logs.String(); strings.Contains(l, "revoke: frontiers not committed") {
		t.Errorf("the revoke says its frontier was not committed, yet the broker holds it:\n%s", l)
	}
	for _, m := range []*member{b, a} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_ = m.c.Close(ctx)
		cancel()
		if err := <-m.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}
