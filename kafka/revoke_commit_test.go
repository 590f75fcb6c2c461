package kafka

import (
	"context"
	"errors"
	"strings"
	"sync"
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

// Close racing a revoke in progress (the revoke waiting for handlers that
// block until their context ends, under a 9 s revoke timeout) while every
// commit is refused, called twice at once, the second time with a context
// that has already ended: both calls return within their context plus
// CloseMargin; the one that closes says (and the other the same, or that
// another Close still runs), naming the unfinished records and
// the frontiers not committed with the offsets the broker holds, and Run
// returns nil. (Before TestRebalanceNotHeldByFailingIntervalCommits's
// fix the revoke never started: the failing interval commits held the
// rejoin.)
func TestCloseDuringARevokeThatCannotCommit(t *testing.T) {
	tc := newCluster(t, 2, "t")
	group := groupName(t)
	tc.produceSpread(t, "t", 2, 4)
	tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.CoordinatorNotAvailable, Count: -1})
	block := func(ctx context.Context, _ *kgo.Record) error { <-ctx.Done(); return ctx.Err() }
	a := runMember(t, block, WithLogger(quiet), WithCommitInterval(20*time.Millisecond), WithRevokeTimeout(9*time.Second),
		WithClientOptions(tc.clientOptsFor(protoCooperative, group, "t")...))
	eventually(t, "a handler running on each partition", func() bool {
		ps := a.c.owned()
		return len(ps) == 2 && ps[0].running.Load() > 0 && ps[1].running.Load() > 0
	})
	b := runMember(t, func(context.Context, *kgo.Record) error { return nil }, WithLogger(quiet),
		WithCommitInterval(time.Hour), WithClientOptions(tc.clientOptsFor(protoCooperative, group, "t")...))
	eventually(t, "a revoke in progress on member a", func() bool {
		for _, p := range a.c.owned() {
			if p.state.Load() == stRevoking {
				return true
			}
		}
		return false
	})
	const ctxD = 300 * time.Millisecond
	var wg sync.WaitGroup
	errs := make([]error, 2)
	took := make([]time.Duration, 2)
	for i, d := range []time.Duration{ctxD, -time.Second} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i], took[i] = closeWithin(a.c, d)
		}()
	}
	wg.Wait()
	for i, d := range []time.Duration{ctxD, 0} {
		// The second call waits for the first: bound both by the first's.
		if bound := ctxD + CloseMargin + time.Second; took[i] > bound {
			t.Errorf("Close %d (context %v) took %v (bound %v)", i, d, took[i], bound)
		}
	}
	// The call that closes gives the error; the other one the same, or,
	// when its context ended first, that another Close still runs.
	err := errs[0]
	if strings.Contains(err.Error(), "another Close is still running") {
		err = errs[1]
	}
	for _, e := range errs {
		if e.Error() != err.Error() && (!strings.Contains(e.Error(), "another Close is still running") || !errors.Is(e, context.DeadlineExceeded)) {
			t.Errorf("Close: %v and %v, want one error, or the other 'another Close is still running'", errs[0], errs[1])
		}
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "records unfinished") {
		t.Errorf("Close: %v, want the unfinished records named", err)
	}
	var ce *CommitError
	if !errors.As(err, &ce) {
		t.Errorf("Close: %v, want a *CommitError for the partition it kept", err)
	} else {
		for _, pc := range ce.Partitions {
			if off := tc.committedOffset(t, group, pc.Topic, pc.Partition); off != pc.Committed {
				t.Errorf("uncommitted %+v: the broker holds %d", pc, off)
			}
		}
	}
	if err := <-a.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_ = b.c.Close(ctx)
	cancel()
	if err := <-b.done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
