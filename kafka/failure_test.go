package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func header(r *kgo.Record, k string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value), true
		}
	}
	return "", false
}

// Properties 3 and 4: several records of one partition failing at once are
// each retried and each dead-lettered; a panic is a failure, retried and
// dead-lettered with its value; a key's next record starts only after the
// dead letter is written; dead letters carry the record and the headers.
func TestFailuresRetriedAndDeadLettered(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	var rs []*kgo.Record
	for i := range 20 {
		r := rec("t", 0, fmt.Sprintf("k%d", i%5), fmt.Sprintf("v%d", i))
		r.Headers = []kgo.RecordHeader{{Key: "h1", Value: []byte(fmt.Sprint(i))}}
		rs = append(rs, r)
	}
	tc.produce(t, rs...)
	failing := map[int64]bool{3: true, 8: true, 4: true}
	const panicking = 9
	var mu sync.Mutex
	attempts := map[int64]int{}
	var bad []string
	var handled atomic.Int64
	h := func(ctx context.Context, r *kgo.Record) error {
		mu.Lock()
		attempts[r.Offset]++
		mu.Unlock()
		// Key k3's records 13 and 18 come after its failing 3 and 8; key
		// k4's 14 and 19 after 4 and 9: their dead letters must be written.
		if need := map[int64]int64{13: 2, 14: 3}[r.Offset]; need > 0 {
			if n := tc.endOffset(t, "dlq", 0); n < need {
				mu.Lock()
				bad = append(bad, fmt.Sprintf("offset %d started with %d dead letters written, want >= %d", r.Offset, n, need))
				mu.Unlock()
			}
		}
		if failing[r.Offset] {
			return fmt.Errorf("boom %d", r.Offset)
		}
		if r.Offset == panicking {
			panic(fmt.Sprintf("panic %d", r.Offset))
		}
		handled.Add(1)
		return nil
	}
	commits := tc.watchCommits(t)
	c := startConsumer(t, h, WithLogger(quiet), WithDeadLetterTopic("dlq"), WithCommitInterval(5*time.Millisecond),
		WithSchedulerOptions(keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "final commit of 20", func() bool {
		cs := commits.of("t", 0)
		return len(cs) > 0 && cs[len(cs)-1].Offset == 20
	})
	if handled.Load() != 16 {
		t.Errorf("handled %d, want 16", handled.Load())
	}
	mu.Lock()
	for off := range failing {
		if attempts[off] != 3 {
			t.Errorf("offset %d: %d attempts, want 3", off, attempts[off])
		}
	}
	if attempts[panicking] != 3 {
		t.Errorf("panicking offset: %d attempts, want 3 (a panic is retried like a failure)", attempts[panicking])
	}
	for _, b := range bad {
		t.Error(b)
	}
	mu.Unlock()
	dead := tc.readAll(t, "dlq", 4)
	var offs []string
	for _, d := range dead {
		off, _ := header(d, HeaderOffset)
		offs = append(offs, off)
		orig := rs[mustAtoi(t, off)]
		if string(d.Key) != string(orig.Key) || string(d.Value) != string(orig.Value) {
			t.Errorf("dead letter %s: key %q value %q, want %q %q", off, d.Key, d.Value, orig.Key, orig.Value)
		}
		if v, _ := header(d, "h1"); v != off {
			t.Errorf("dead letter %s lost the original header: %q", off, v)
		}
		want := map[string]string{HeaderTopic: "t", HeaderPartition: "0", HeaderConsumerGroup: c.Group(), HeaderAttempts: "3",
			HeaderTimestamp: fmt.Sprint(orig.Timestamp.UnixMilli())}
		if off == "9" {
			want[HeaderMessage] = "panic 9"
			want[HeaderExceptionClass] = "*keysched.PanicError"
			if st, ok := header(d, HeaderStacktrace); !ok || !strings.Contains(st, "goroutine") {
				t.Errorf("panic dead letter without a stack: %q", st)
			}
		} else {
			want[HeaderMessage] = "boom " + off
		}
		for k, v := range want {
			if got, ok := header(d, k); k == HeaderTimestamp && orig.Timestamp.IsZero() {
				continue
			} else if !ok || got != v {
				t.Errorf("dead letter %s: header %s = %q, want %q", off, k, got, v)
			}
		}
	}
	slices.Sort(offs)
	if fmt.Sprint(offs) != "[3 4 8 9]" {
		t.Errorf("dead letters for offsets %v, want 3 4 8 9 once each", offs)
	}
	if st := c.Stats(); st.DeadLettered != 4 {
		t.Errorf("Stats.DeadLettered %d", st.DeadLettered)
	}
}

func mustAtoi(t *testing.T, s string) int {
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

// failProduces makes the cluster refuse every Produce while on is set.
func (tc *testCluster) failProduces(on *atomic.Bool) {
	tc.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		tc.KeepControl()
		if !on.Load() {
			return nil, nil, false
		}
		r := req.(*kmsg.ProduceRequest)
		resp := r.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range r.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// Property 4: when the dead-letter produce fails the record is not
// finished: the frontier stays, the key waits; once the produce goes
// through, both move on.
func TestDeadLetterProduceFailureLeavesRecordUnfinished(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	tc.produce(t, rec("t", 0, "a", "fail"), rec("t", 0, "a", "next"), rec("t", 0, "b", "other"))
	commits := tc.watchCommits(t)
	var failing atomic.Bool
	failing.Store(true)
	tc.failProduces(&failing)
	var next, other atomic.Bool
	h := func(ctx context.Context, r *kgo.Record) error {
		switch string(r.Value) {
		case "fail":
			return keysched.Permanent(errors.New("bad record"))
		case "next":
			next.Store(true)
		case "other":
			other.Store(true)
		}
		return nil
	}
	logs := &logBuffer{}
	c := startConsumer(t, h, WithLogger(logs.logger()), WithDeadLetterTopic("dlq"), WithCommitInterval(5*time.Millisecond),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "the other key handled and a failed dead-letter produce logged", func() bool {
		return other.Load() && strings.Contains(logs.String(), "dead-letter produce failing")
	})
	eventually(t, "a commit made while the dead letter fails", func() bool { return len(commits.of("t", 0)) > 0 })
	if next.Load() {
		t.Fatal("the key's next record ran before its failed record's dead letter was written")
	}
	if ps, _ := c.partStats("t", 0); ps.Frontier != 0 || ps.InFlight != 2 {
		t.Errorf("while the dead letter fails: %+v", ps)
	}
	for _, cm := range commits.of("t", 0) {
		if cm.Offset > 0 {
			t.Fatalf("committed %d past the record whose dead letter failed", cm.Offset)
		}
	}
	failing.Store(false)
	eventually(t, "commit of 3", func() bool {
		cs := commits.of("t", 0)
		return next.Load() && len(cs) > 0 && cs[len(cs)-1].Offset == 3
	})
	if n := tc.endOffset(t, "dlq", 0); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
	// One log line per state change, not one per retry.
	eventually(t, "the recovery logged", func() bool { return strings.Contains(logs.String(), "dead-letter produce recovered") })
	if l := logs.String(); strings.Count(l, "dead-letter produce failing") != 1 || strings.Count(l, "dead-letter produce recovered") != 1 {
		t.Errorf("want one failing and one recovered line, got:\n%s", l)
	}
}

// Park, Resume and Skip: a parked key holds its later records and the
// frontier; Resume runs the record again; Skip dead-letters it.
func TestParkResumeSkip(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	tc.produce(t, rec("t", 0, "a", "a0"), rec("t", 0, "a", "a1"), rec("t", 0, "b", "b0"), rec("t", 0, "b", "b1"), rec("t", 0, "c", "c0"))
	commits := tc.watchCommits(t)
	var fixed atomic.Bool
	var mu sync.Mutex
	var seen []string
	h := func(ctx context.Context, r *kgo.Record) error {
		v := string(r.Value)
		if v == "b0" || (v == "a0" && !fixed.Load()) {
			return errors.New("fails " + v)
		}
		mu.Lock()
		seen = append(seen, v)
		mu.Unlock()
		return nil
	}
	has := func(v string) bool { mu.Lock(); defer mu.Unlock(); return slices.Contains(seen, v) }
	c := startConsumer(t, h, WithLogger(quiet), WithDeadLetterTopic("dlq"), WithCommitInterval(5*time.Millisecond),
		WithSchedulerOptions(keysched.WithFailurePolicy(keysched.Park)),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "two keys parked, c handled", func() bool { return len(c.Parked()) == 2 && has("c0") })
	if has("a1") || has("b1") {
		t.Fatal("a parked key's next record ran")
	}
	if ps, _ := c.partStats("t", 0); ps.Frontier != 0 {
		t.Errorf("frontier %d with offset 0 parked", ps.Frontier)
	}
	if n := tc.endOffset(t, "dlq", 0); n != 0 {
		t.Errorf("parking wrote %d dead letters; only Skip does", n)
	}
	parked := map[string]ParkedKey{}
	for _, k := range c.Parked() {
		parked[string(k.Key)] = k
	}
	if k := parked["b"]; k.Offset != 2 || k.Topic != "t" || k.Err == nil || k.Attempts != 1 {
		t.Errorf("parked b: %+v", k)
	}
	fixed.Store(true)
	if err := c.Resume(parked["a"]); err != nil {
		t.Fatal(err)
	}
	if err := c.Resume(parked["a"]); !errors.Is(err, ErrNotParked) {
		t.Errorf("second Resume: %v", err)
	}
	eventually(t, "a resumed", func() bool { return has("a0") && has("a1") })
	if err := c.Skip(parked["b"]); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b moved on and commit of 5", func() bool {
		cs := commits.of("t", 0)
		return has("b1") && len(cs) > 0 && cs[len(cs)-1].Offset == 5
	})
	d := tc.readAll(t, "dlq", 1)[0]
	if off, _ := header(d, HeaderOffset); off != "2" || string(d.Value) != "b0" {
		t.Errorf("dead letter %s %q", off, d.Value)
	}
	if len(c.Parked()) != 0 {
		t.Errorf("still parked: %v", c.Parked())
	}
}

// Revoke vs lost: a lost partition is not committed; its running handler is
// interrupted and the record handled again after the member rejoins.
func TestLostPartitionIsNotCommitted(t *testing.T) {
	for _, proto := range groupProtocols {
		t.Run(string(proto), func(t *testing.T) { testLostPartitionIsNotCommitted(t, proto) })
	}
}

func testLostPartitionIsNotCommitted(t *testing.T, proto groupProtocol) {
	tc := newCluster(t, 1, "t")
	tc.produce(t, rec("t", 0, "a", "0"), rec("t", 0, "b", "1"), rec("t", 0, "c", "2"))
	commits := tc.watchCommits(t)
	var interrupted atomic.Bool
	var handled sync.Map
	h := func(ctx context.Context, r *kgo.Record) error {
		if r.Offset == 1 && !interrupted.Load() {
			<-ctx.Done()
			interrupted.Store(true)
			return ctx.Err()
		}
		n, _ := handled.LoadOrStore(r.Offset, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		return nil
	}
	group := groupName(t)
	c := startConsumer(t, h, WithLogger(quiet), WithCommitInterval(time.Hour), WithRevokeTimeout(20*time.Millisecond),
		WithClientOptions(tc.clientOptsFor(proto, group, "t")...))
	eventually(t, "offsets 0 and 2 handled", func() bool {
		_, a := handled.Load(int64(0))
		_, b := handled.Load(int64(2))
		return a && b
	})
	// The next heartbeat says the member is unknown: franz-go reports the
	// partitions lost and rejoins.
	// (KIP-848: the next ConsumerGroupHeartbeat.)
	tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat, kmsg.ConsumerGroupHeartbeat}, Group: group, Err: kerr.UnknownMemberID, TopLevel: true})
	eventually(t, "the partition assigned again, offset 1 handled", func() bool {
		ps, ok := c.partStats("t", 0)
		_, done := handled.Load(int64(1))
		return ok && ps.Epoch == 2 && done && interrupted.Load()
	})
	if cs := commits.of("t", 0); len(cs) != 0 {
		t.Errorf("commits %+v after a loss with a one-hour interval", cs)
	}
}

// Retries stay per record when one key's records share a task (a group):
// offset 0 fails once, 1 always, 2 twice, 3 panics always, 4 succeeds; with
// three attempts, 1 and 3 get three each and are dead-lettered, 2 gets three
// and succeeds, 0 two; none borrows another's attempts. Keys interleave
// (k and j) so that the groups are not runs of consecutive offsets.
func TestRetriesPerRecordInAGroup(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	var rs []*kgo.Record
	for i := range 10 {
		key := "k"
		if i%2 == 1 {
			key = "j"
		}
		rs = append(rs, rec("t", 0, key, fmt.Sprint(i)))
	}
	tc.produce(t, rs...) // before the consumer starts: one fetch, one poll, one group per key
	fails := map[int64]int{0: 1, 2: 100, 4: 2, 6: 100, 1: 2, 3: 100}
	var mu sync.Mutex
	attempts := map[int64]int{}
	var order []int64
	h := func(ctx context.Context, r *kgo.Record) error {
		mu.Lock()
		attempts[r.Offset]++
		n := attempts[r.Offset]
		order = append(order, r.Offset)
		mu.Unlock()
		if n <= fails[r.Offset] {
			if r.Offset == 6 {
				panic("six")
			}
			return fmt.Errorf("fail %d", r.Offset)
		}
		return nil
	}
	commits := tc.watchCommits(t)
	startConsumer(t, h, WithLogger(quiet), WithDeadLetterTopic("dlq"), WithCommitInterval(5*time.Millisecond),
		WithSchedulerOptions(keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "final commit of 10", func() bool {
		cs := commits.of("t", 0)
		return len(cs) > 0 && cs[len(cs)-1].Offset == 10
	})
	mu.Lock()
	want := map[int64]int{0: 2, 1: 3, 2: 3, 3: 3, 4: 3, 5: 1, 6: 3, 7: 1, 8: 1, 9: 1}
	for off, n := range want {
		if attempts[off] != n {
			t.Errorf("offset %d: %d attempts, want %d", off, attempts[off], n)
		}
	}
	// Per key, a record's first attempt comes after every attempt of the
	// key's earlier records.
	lastSeen := map[int64]int{}
	for i, off := range order {
		lastSeen[off] = i
	}
	firstSeen := map[int64]int{}
	for i := len(order) - 1; i >= 0; i-- {
		firstSeen[order[i]] = i
	}
	for off := int64(2); off < 10; off++ {
		if firstSeen[off] < lastSeen[off-2] {
			t.Errorf("offset %d started before offset %d's last attempt", off, off-2)
		}
	}
	mu.Unlock()
	var offs []string
	for _, d := range tc.readAll(t, "dlq", 3) {
		off, _ := header(d, HeaderOffset)
		n, _ := header(d, HeaderAttempts)
		offs = append(offs, off+"/"+n)
	}
	slices.Sort(offs)
	if fmt.Sprint(offs) != "[2/3 3/3 6/3]" {
		t.Errorf("dead letters (offset/attempts) %v, want 2/3 3/3 6/3", offs)
	}
}

// With keysched.WithTaskTimeout every record is a task of its own, so each
// gets the whole timeout: thirty records of one key, 50 ms each, under a
// 1 s timeout all succeed (in one group they would share one attempt's
// deadline and the later ones would fail).
func TestTaskTimeoutPerRecord(t *testing.T) {
	tc := newCluster(t, 1, "t")
	var rs []*kgo.Record
	for i := range 30 {
		rs = append(rs, rec("t", 0, "k", fmt.Sprint(i)))
	}
	tc.produce(t, rs...)
	var ok, failed atomic.Int64
	c := startConsumer(t, func(ctx context.Context, r *kgo.Record) error {
		tm := time.NewTimer(50 * time.Millisecond)
		defer tm.Stop()
		select {
		case <-tm.C:
			ok.Add(1)
			return nil
		case <-ctx.Done():
			failed.Add(1)
			return ctx.Err()
		}
	}, WithLogger(quiet), WithSchedulerOptions(keysched.WithTaskTimeout(time.Second)),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	if !c.perRecord {
		t.Fatal("the consumer did not see the scheduler's task timeout")
	}
	eventually(t, "thirty records finished", func() bool { return c.Stats().Finished == 30 })
	if ok.Load() != 30 || failed.Load() != 0 {
		t.Errorf("%d handled, %d timed out; want 30 and 0", ok.Load(), failed.Load())
	}
}
