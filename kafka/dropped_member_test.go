package kafka

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handlings records the handlers' starts and ends, per member.
type handlings struct {
	mu     sync.Mutex
	events []handling
}

type handling struct {
	member string
	key    string
	off    int64
	end    bool
}

func (h *handlings) add(member string, r *kgo.Record, end bool) {
	h.mu.Lock()
	h.events = append(h.events, handling{member, string(r.Key), r.Offset, end})
	h.mu.Unlock()
}

// orderViolations checks, within each member, that no two handlers of one
// key ran at once, and that no record of a key was handled for the first
// time by a member before that member finished every earlier record of the
// key it had started.
func (h *handlings) orderViolations() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	type mk struct{ member, key string }
	running := map[mk]int64{}
	seen := map[mk]map[int64]bool{}     // offsets started
	finished := map[mk]map[int64]bool{} // offsets finished
	var out []string
	for _, e := range h.events {
		k := mk{e.member, e.key}
		if seen[k] == nil {
			seen[k], finished[k] = map[int64]bool{}, map[int64]bool{}
		}
		if e.end {
			delete(running, k)
			finished[k][e.off] = true
			continue
		}
		if o, ok := running[k]; ok {
			out = append(out, fmt.Sprintf("member %s key %s: offset %d started while %d ran", e.member, e.key, e.off, o))
		}
		running[k] = e.off
		if !seen[k][e.off] {
			for o := range seen[k] {
				if o < e.off && !finished[k][o] {
					out = append(out, fmt.Sprintf("member %s key %s: offset %d started before %d finished", e.member, e.key, e.off, o))
				}
			}
		}
		seen[k][e.off] = true
	}
	return out
}

// handledBy returns the offsets each member finished.
func (h *handlings) handledBy(member string) map[int64]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[int64]bool{}
	for _, e := range h.events {
		if e.member == member && e.end {
			out[e.off] = true
		}
	}
	return out
}

// A member the broker dropped (its heartbeats refused past its session
// timeout while franz-go keeps retrying them: a heartbeat retry timeout
// longer than the session, as a read timeout longer than the session
// gives) goes on handling; the group has given its partition to another
// member meanwhile, and both handle the same records. What holds: order per
// key within each member, and fencing on the broker: the dropped member's
// late commits are refused (UNKNOWN_MEMBER_ID), the new owner's commit
// stays.
func TestDroppedMemberKeepsOrderAndIsFencedOnCommit(t *testing.T) {
	const N = 40 // one partition, keys k0..k3 round robin: offset i has key k(i%4)
	tc := newCluster(t, 1, "t")
	group := groupName(t)
	var rs []*kgo.Record
	for i := range N {
		rs = append(rs, rec("t", 0, fmt.Sprintf("k%d", i%4), fmt.Sprint(i)))
	}
	tc.produce(t, rs...)
	var h handlings
	releaseA := make(chan struct{})  // offsets 8.. of member a wait for it
	release24 := make(chan struct{}) // offset 24 (k0) of member a waits for it: a's frontier stays below the end
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(releaseA) }); close(release24) })
	logs := &logBuffer{}
	a := runMember(t, func(ctx context.Context, r *kgo.Record) error {
		h.add("a", r, false)
		defer h.add("a", r, true)
		var gate chan struct{}
		switch {
		case r.Offset == 24:
			gate = release24
		case r.Offset >= 8:
			gate = releaseA
		}
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}, WithLogger(logs.logger()), WithCommitInterval(20*time.Millisecond), WithRevokeTimeout(time.Second),
		WithClientOptions(append(tc.clientOpts(group, "t"),
			kgo.SessionTimeout(500*time.Millisecond),
			// franz-go retries a refused heartbeat up to its retry
			// timeout (the session timeout by default) before it
			// says the partitions are lost: longer here, so that the
			// member goes on as one whose heartbeats time out slower
			// than its session does.
			kgo.RetryTimeoutFn(func(key int16) time.Duration {
				if key == int16(kmsg.Heartbeat) {
					return time.Minute
				}
				return 30 * time.Second
			}))...))
	eventually(t, "member a handled offsets 0-7 and committed 8", func() bool {
		ps, ok := a.c.partStats("t", 0)
		return ok && ps.Committed == 8
	})
	b := runMember(t, func(_ context.Context, r *kgo.Record) error {
		h.add("b", r, false)
		h.add("b", r, true)
		return nil
	}, WithLogger(quiet), WithCommitInterval(20*time.Millisecond), WithClientOptions(tc.clientOpts(group, "t")...))
	eventually(t, "member b in the group, a keeping the partition", func() bool {
		am, ag := a.c.Client().GroupMetadata()
		bm, bg := b.c.Client().GroupMetadata()
		_, owned := a.c.partStats("t", 0)
		return am != "" && bm != "" && ag > 0 && ag == bg && owned
	})
	aID, _ := a.c.Client().GroupMetadata()
	hb := tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat}, Group: group, Err: kerr.CoordinatorNotAvailable, Count: -1,
		When: func(req kmsg.Request) bool { return req.(*kmsg.HeartbeatRequest).MemberID == aID }})
	eventually(t, "member b owns the partition and committed the end, a still handling", func() bool {
		ps, ok := b.c.partStats("t", 0)
		_, aOwns := a.c.partStats("t", 0)
		return ok && ps.Committed == N && aOwns
	})
	if off := tc.committedOffset(t, group, "t", 0); off != N {
		t.Fatalf("the broker holds %d, want %d (b's commit)", off, N)
	}
	// Member a does not know: released, it handles on and commits its
	// frontier (24), which the broker refuses.
	once.Do(func() { close(releaseA) })
	eventually(t, "member a's commit refused", func() bool {
		ps, ok := a.c.partStats("t", 0)
		return ok && ps.Frontier == 24 && a.c.Stats().CommitErrors > 0
	})
	if off := tc.committedOffset(t, group, "t", 0); off != N {
		t.Errorf("the broker holds %d after the dropped member's commit, want %d (b's commit)", off, N)
	}
	if l := logs.String(); !strings.Contains(l, "UNKNOWN_MEMBER_ID") {
		t.Errorf("member a's commit refused, but not for UNKNOWN_MEMBER_ID:\n%s", l)
	}
	if v := h.orderViolations(); len(v) > 0 {
		t.Errorf("order within a member broken:\n%s", strings.Join(v, "\n"))
	}
	// The documented duplicates: both members handled offsets past a's
	// last commit.
	byA, byB := h.handledBy("a"), h.handledBy("b")
	both := 0
	for off := range byA {
		if byB[off] {
			both++
		}
	}
	if both == 0 {
		t.Errorf("no record handled by both members (a: %d, b: %d): the dropped member was expected to go on", len(byA), len(byB))
	}
	t.Logf("records handled by both members: %d (a: %d, b: %d)", both, len(byA), len(byB))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_ = a.c.Close(ctx) // its final commit refused too, offset 24 unfinished
	cancel()
	if err := <-a.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	hb.Remove()
	if off := tc.committedOffset(t, group, "t", 0); off != N {
		t.Errorf("the broker holds %d after the dropped member closed, want %d (b's commit)", off, N)
	}
	b.close(t)
}
