package kafka

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A record handed on into the key's next group (one of a later poll) and
// parked there can be skipped: Skip finds the group the record is in now,
// not the one it was fetched into. Poll 1 makes group [a0 a1], poll 2 (while
// a0 runs) group [a2]; a0 fails once, then a1 fails after a0's success, so
// a1 is handed on to the front of [a2]; there a1 fails again and parks.
// Skip must dead-letter a1 and move on to a2 (it panicked: it handed on from
// the first group, whose records were gone).
func TestSkipRecordHandedOnToNextGroup(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	tc.produce(t, rec("t", 0, "a", "a0"), rec("t", 0, "a", "a1"))
	release := make(chan struct{})
	var a0Tries atomic.Int32
	var mu sync.Mutex
	var seen []string
	h := func(ctx context.Context, r *kgo.Record) error {
		v := string(r.Value)
		switch v {
		case "a0":
			if a0Tries.Add(1) == 1 {
				<-release
				return errors.New("a0 fails once")
			}
		case "a1":
			return errors.New("a1 always fails")
		}
		mu.Lock()
		seen = append(seen, v)
		mu.Unlock()
		return nil
	}
	commits := tc.watchCommits(t)
	c := startConsumer(t, h, WithLogger(quiet), WithDeadLetterTopic("dlq"), WithCommitInterval(5*time.Millisecond),
		WithSchedulerOptions(keysched.WithFailurePolicy(keysched.Park),
			keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "a0 running", func() bool { return a0Tries.Load() == 1 })
	tc.produce(t, rec("t", 0, "a", "a2"))
	eventually(t, "a2 fetched while a0 runs", func() bool {
		ps, _ := c.partStats("t", 0)
		return ps.HighestFetched == 2
	})
	close(release)
	eventually(t, "a1 parked", func() bool { ks := c.Parked(); return len(ks) == 1 && ks[0].Offset == 1 })
	k := c.Parked()[0]
	if k.Attempts != 2 {
		t.Errorf("a1 parked after %d attempts, want 2", k.Attempts)
	}
	func() {
		defer func() {
			if v := recover(); v != nil {
				t.Fatalf("Skip panicked: %v", v)
			}
		}()
		if err := c.Skip(k); err != nil {
			t.Fatal(err)
		}
	}()
	eventually(t, "a2 handled and commit of 3", func() bool {
		mu.Lock()
		ok := fmt.Sprint(seen) == "[a0 a2]"
		mu.Unlock()
		cs := commits.of("t", 0)
		return ok && len(cs) > 0 && cs[len(cs)-1].Offset == 3
	})
	d := tc.readAll(t, "dlq", 1)[0]
	if off, _ := header(d, HeaderOffset); off != "1" {
		t.Errorf("dead letter of offset %s, want 1", off)
	}
}

// A handler that calls runtime.Goexit (t.FailNow in a test's handler) fails
// its attempt like a panic: the record is retried, then dead-lettered, and
// the rest of its group goes on. (The scheduler finished the task as a
// panic, but the dead-letter function did not find the group: the record
// stayed unfinished, the frontier stuck on it, and the group's later record
// was never handled.)
func TestHandlerGoexitIsAFailure(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	tc.produce(t, rec("t", 0, "a", "a0"), rec("t", 0, "a", "a1"))
	var tries atomic.Int32
	var a1 atomic.Bool
	h := func(ctx context.Context, r *kgo.Record) error {
		if string(r.Value) == "a0" {
			tries.Add(1)
			runtime.Goexit()
		}
		a1.Store(true)
		return nil
	}
	commits := tc.watchCommits(t)
	c := startConsumer(t, h, WithLogger(quiet), WithDeadLetterTopic("dlq"), WithCommitInterval(5*time.Millisecond),
		WithSchedulerOptions(keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "a1 handled and commit of 2", func() bool {
		cs := commits.of("t", 0)
		return a1.Load() && len(cs) > 0 && cs[len(cs)-1].Offset == 2
	})
	if n := tries.Load(); n != 2 {
		t.Errorf("a0 tried %d times, want 2", n)
	}
	if n := c.Stats().DeadLettered; n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
}

// A revoke (here a loss) stops a group between records: no handler of a
// partition being revoked starts, so the rest of the group is left to the
// next assignment (it ran on, after the revoke began, for records a new
// owner may be handling at the same time). a0 of group [a0 a1 a2] returns
// only once the loss has begun; a1 and a2 must then be handled by the next
// assignment alone.
func TestRevokeStopsGroupBetweenRecords(t *testing.T) {
	tc := newCluster(t, 1, "t")
	tc.produce(t, rec("t", 0, "a", "a0"), rec("t", 0, "a", "a1"), rec("t", 0, "a", "a2"))
	var first atomic.Pointer[partition]
	var stale atomic.Int32
	var lateDone atomic.Bool
	h := func(ctx context.Context, r *kgo.Record) error {
		g, _ := ctx.Value(groupKey{}).(*group)
		if p1 := first.Load(); p1 != nil && g.p == p1 && r.Offset > 0 {
			stale.Add(1)
		}
		if r.Offset == 0 && first.CompareAndSwap(nil, g.p) {
			eventually(t, "the loss begun", func() bool { return !g.p.active() })
			return nil
		}
		if r.Offset == 2 && g.p != first.Load() {
			lateDone.Store(true)
		}
		return nil
	}
	c := startConsumer(t, h, WithLogger(quiet), WithCommitInterval(time.Hour), WithRevokeTimeout(9*time.Second),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "a0 running", func() bool { return first.Load() != nil })
	tc.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = kerr.UnknownMemberID.Code
		return resp, nil, true
	})
	eventually(t, "a2 handled by the next assignment", func() bool {
		ps, ok := c.partStats("t", 0)
		return ok && ps.Epoch == 2 && lateDone.Load()
	})
	if n := stale.Load(); n != 0 {
		t.Errorf("%d handlers of the lost assignment started after the loss began", n)
	}
}

// commitLocked takes the frontier, then lists the unfinished offsets in a
// second pass; records finish without the partition's lock, so the frontier
// record may finish in between and the list then starts above the frontier.
// The encoding must not claim the list's first offset finished (it claimed
// (base, second unfinished) finished, the first unfinished one included, and
// a new owner skipped that record: never handled nor dead-lettered).
func TestMetadataFrontierFinishedMeanwhile(t *testing.T) {
	// Frontier 10 taken; 10 finished; then 12 and 15 listed unfinished.
	meta, _ := encodeFinished(10, []int64{12, 15}, true, 20, 4096)
	spans := decodeFinished(meta, 10)
	for _, s := range spans {
		for _, u := range []int64{12, 15} {
			if s.from <= u && u <= s.to {
				t.Errorf("%q claims unfinished offset %d finished (spans %v)", meta, u, spans)
			}
		}
	}
	if fmt.Sprint(spans) != "[{11 11} {13 14} {16 20}]" {
		t.Errorf("%q decodes to %v, want [{11 11} {13 14} {16 20}]", meta, spans)
	}
	// The same through the partition: frontier, the head finishes, list.
	c := &Consumer{}
	c.cfg.maxInFlight = 100
	p := newPartition(c, "t", 0, 1)
	defer p.cancel()
	for off := int64(10); off <= 20; off++ {
		it := p.takeItem(&kgo.Record{Offset: off})
		p.add(it)
		p.seen(&kgo.Record{Offset: off})
		if off != 12 && off != 15 && off != 10 {
			it.finish()
		}
	}
	off, _, _ := p.frontier()
	p.queue[p.head].finish() // offset 10, by its handler, without p.mu
	meta, _ = encodeFinished(off, p.unfinished(4096), true, p.highest, 4096)
	for _, s := range decodeFinished(meta, off) {
		if s.from <= 12 && 12 <= s.to {
			t.Errorf("frontier %d, metadata %q claims unfinished offset 12 finished", off, meta)
		}
	}
}
