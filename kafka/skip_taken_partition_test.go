package kafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keysched/keysched"
)

// Skip whose partition is taken away (revoked, lost, Close giving up)
// between its start and its dead letter's produce returns an error wrapping
// ErrNotParked, and does not list the key as parked again: the next owner
// handles the record. The interleaving is forced by ending the partition's
// context after the key parked, as the revoke does once Skip has entered.
// Input that broke it (CI, 2026-12-01, TestGroupInvariants/park=true, the
// partition lost mid-Skip): Skip returned "dead letter not written, the key
// stays parked: context canceled" and put the key back in Parked.
func TestSkipWhenThePartitionIsTakenAwayIsNotParked(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	tc.produce(t, rec("t", 0, "b", "b0"))
	c := startConsumer(t, func(context.Context, *kgo.Record) error { return errors.New("fails") },
		WithLogger(quiet), WithDeadLetterTopic("dlq"), WithCommitInterval(time.Hour),
		WithSchedulerOptions(keysched.WithFailurePolicy(keysched.Park)),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "b parked", func() bool { return len(c.Parked()) == 1 })
	k := c.Parked()[0]
	p := c.lookup("t", 0)
	if p == nil {
		t.Fatal("partition t/0 not owned")
	}
	p.cancel() // the partition's context ends: its produces fail at once
	err := c.Skip(k)
	if !errors.Is(err, ErrNotParked) {
		t.Fatalf("Skip with its partition taken away: %v, want ErrNotParked", err)
	}
	t.Logf("Skip: %v", err)
	if ks := c.Parked(); len(ks) != 0 {
		t.Errorf("still listed as parked after Skip gave up on a partition taken away: %v", ks)
	}
}
