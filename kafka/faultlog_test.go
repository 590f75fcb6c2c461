package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A lasting fault logs one line per state change, not one per try: the
// first failure, "still failing" after 10 and 100 tries (with the last
// error), the recovery; a second outage starts over.
func TestFaultLogOneLinePerStateChange(t *testing.T) {
	logs := &logBuffer{}
	f := newFaultLog(logs.logger(), "offset commit")
	f.ok() // nothing failing: nothing said
	for i := range 150 {
		f.fail(fmt.Errorf("try %d: %w", i+1, errors.New("COORDINATOR_NOT_AVAILABLE")), "partition", 3)
	}
	f.ok()
	f.ok()
	f.fail(errors.New("again"))
	l := logs.String()
	lines := strings.Split(strings.TrimSpace(l), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines, want 5 (failing, still failing x2, recovered, failing):\n%s", len(lines), l)
	}
	for i, want := range []string{"offset commit failing", "still failing", "still failing", "recovered", "offset commit failing"} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d: %s, want %q", i, lines[i], want)
		}
	}
	if !strings.Contains(lines[1], "tries=10") || !strings.Contains(lines[1], "try 10:") || !strings.Contains(lines[2], "tries=100") ||
		!strings.Contains(lines[3], "failed_tries=150") || !strings.Contains(lines[0], "partition=3") {
		t.Errorf("the lines lack the tries, the last error or the attributes:\n%s", l)
	}
}

// A commit with nothing to send (here the frontier of a partition already
// on the broker, as a revoke of such a partition commits) is no recovery:
// while every OffsetCommit of the group is refused, the log says
// "offset commit failing" once and never "recovered". Input that broke it:
// partition 1 committed, then commits refused for good and a record on
// partition 0 only; committing partition 1 alone (a revoke of it) logged
// "offset commit recovered", and the next interval commit "failing" again.
func TestFaultLogNoRecoveryWithoutACommit(t *testing.T) {
	tc := newCluster(t, 2, "t")
	group := groupName(t)
	tc.produce(t, rec("t", 0, "a", "0"), rec("t", 1, "b", "1"))
	logs := &logBuffer{}
	c := startConsumer(t, func(context.Context, *kgo.Record) error { return nil }, WithLogger(logs.logger()),
		WithCommitInterval(20*time.Millisecond), WithClientOptions(tc.clientOpts(group, "t")...))
	eventually(t, "both frontiers committed", func() bool {
		p0, _ := c.partStats("t", 0)
		p1, _ := c.partStats("t", 1)
		return p0.Committed == 1 && p1.Committed == 1
	})
	f := tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.UnknownServerError, Count: -1})
	tc.produce(t, rec("t", 0, "a", "2"))
	eventually(t, "the commits of partition 0 refused", func() bool {
		return f.Hits() >= 2 && strings.Contains(logs.String(), "offset commit failing")
	})
	p1 := c.lookup("t", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if failed := c.commit(ctx, []*partition{p1}, "revoke"); len(failed) != 0 {
		t.Fatalf("partition 1 had nothing to commit, yet %v", failed)
	}
	eventually(t, "another refused commit", func() bool { return f.Hits() >= 4 })
	l := logs.String()
	if strings.Contains(l, "recovered") || strings.Count(l, "offset commit failing") != 1 {
		t.Errorf("want one 'failing' line and no 'recovered' while every commit is refused:\n%s", l)
	}
	f.Remove()
}
