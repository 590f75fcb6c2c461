package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// seqTracker checks, across members, that no record of a key is handled for
// the first time before every earlier record of that key finished. Values
// carry each record's sequence number within its key.
type seqTracker struct {
	mu       sync.Mutex
	started  map[string]map[int]bool
	finished map[string]map[int]bool
	handled  atomic.Int64
	bad      []string
}

func newSeqTracker() *seqTracker {
	return &seqTracker{started: map[string]map[int]bool{}, finished: map[string]map[int]bool{}}
}

func (s *seqTracker) key(r *kgo.Record) string {
	return fmt.Sprintf("%s/%d/%s", r.Topic, r.Partition, r.Key)
}

func (s *seqTracker) handler(work time.Duration) Handler {
	return func(ctx context.Context, r *kgo.Record) error {
		k := s.key(r)
		seq, _ := strconv.Atoi(string(r.Value))
		s.mu.Lock()
		if s.started[k] == nil {
			s.started[k], s.finished[k] = map[int]bool{}, map[int]bool{}
		}
		if !s.started[k][seq] {
			s.started[k][seq] = true
			for e := range seq {
				if !s.finished[k][e] {
					s.bad = append(s.bad, fmt.Sprintf("%s: record %d handled first before %d finished", k, seq, e))
				}
			}
		}
		s.mu.Unlock()
		if work > 0 {
			t := time.NewTimer(work)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		s.mu.Lock()
		s.finished[k][seq] = true
		s.mu.Unlock()
		s.handled.Add(1)
		return nil
	}
}

func (s *seqTracker) allFinished(keys []string, perKey map[string]int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		for i := range perKey[k] {
			if !s.finished[k][i] {
				return false
			}
		}
	}
	return true
}

type member struct {
	c    *Consumer
	done chan error
}

func runMember(t *testing.T, h Handler, opts ...Option) *member {
	t.Helper()
	c, err := NewConsumer(h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	m := &member{c: c, done: make(chan error, 1)}
	go func() { m.done <- c.Run(context.Background()) }()
	return m
}

func (m *member) close(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.c.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := <-m.done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// Property 5: with two and then three members joining and leaving under
// load, every record is handled, and no record of a key is handled for the
// first time before an earlier record of that key finished.
func TestRebalanceUnderLoad(t *testing.T) {
	for _, proto := range groupProtocols {
		t.Run(string(proto), func(t *testing.T) { testRebalanceUnderLoad(t, proto) })
	}
}

func testRebalanceUnderLoad(t *testing.T, proto groupProtocol) {
	tc := newCluster(t, 4, "t")
	group := groupName(t)
	tr := newSeqTracker()
	perKey := map[string]int{}
	var keys []string
	produceBatch := func(n int) {
		var rs []*kgo.Record
		for i := range n {
			part := int32(i % 4)
			key := fmt.Sprintf("k%d", i%24)
			k := fmt.Sprintf("t/%d/%s", part, key)
			if _, ok := perKey[k]; !ok {
				keys = append(keys, k)
			}
			rs = append(rs, rec("t", part, key, strconv.Itoa(perKey[k])))
			perKey[k]++
		}
		tc.produce(t, rs...)
	}
	opts := func() []Option {
		return []Option{WithLogger(quiet), WithCommitInterval(10 * time.Millisecond), WithRevokeTimeout(5 * time.Second),
			WithClientOptions(tc.clientOptsFor(proto, group, "t")...)}
	}
	h := tr.handler(200 * time.Microsecond)
	defer tc.expectProtocol(t, group, proto)()
	produceBatch(800)
	m1 := runMember(t, h, opts()...)
	eventually(t, "member 1 at work", func() bool { return tr.handled.Load() > 100 })
	m2 := runMember(t, h, opts()...)
	produceBatch(800)
	eventually(t, "member 2 owns partitions", func() bool { return len(m2.c.Stats().Partitions) > 0 })
	m3 := runMember(t, h, opts()...)
	produceBatch(800)
	eventually(t, "member 3 owns partitions", func() bool { return len(m3.c.Stats().Partitions) > 0 })
	m1.close(t)
	produceBatch(800)
	eventually(t, "member 3 took more", func() bool { return len(m3.c.Stats().Partitions)+len(m2.c.Stats().Partitions) == 4 })
	m2.close(t)
	produceBatch(800)
	eventually(t, "every record finished", func() bool { return tr.allFinished(keys, perKey) })
	m3.close(t)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for i, b := range tr.bad {
		if i > 10 {
			break
		}
		t.Error(b)
	}
}

// Fencing: a member whose partition was revoked while a handler was stuck
// commits nothing more for it, even once the stuck handler returns.
func TestNoCommitAfterRevoke(t *testing.T) {
	for _, proto := range groupProtocols {
		t.Run(string(proto), func(t *testing.T) { testNoCommitAfterRevoke(t, proto) })
	}
}

func testNoCommitAfterRevoke(t *testing.T, proto groupProtocol) {
	tc := newCluster(t, 2, "t")
	commits := tc.watchCommits(t)
	group := groupName(t)
	tc.produce(t, rec("t", 0, "a", "0"), rec("t", 1, "b", "0"))
	release := make(chan struct{})
	var started atomic.Int64
	stuck := func(ctx context.Context, r *kgo.Record) error {
		if string(r.Value) == "0" {
			started.Add(1)
			<-release // ignores ctx: cannot be interrupted
		}
		return nil
	}
	a := runMember(t, stuck, WithLogger(quiet), WithCommitInterval(5*time.Millisecond), WithRevokeTimeout(50*time.Millisecond),
		WithClientOptions(tc.clientOptsFor(proto, group, "t")...))
	eventually(t, "both records stuck", func() bool { return started.Load() == 2 })
	aMember, _ := a.c.Client().GroupMetadata()
	var bHandled atomic.Int64
	b := runMember(t, func(ctx context.Context, r *kgo.Record) error { bHandled.Add(1); return nil },
		WithLogger(quiet), WithCommitInterval(5*time.Millisecond), WithClientOptions(tc.clientOptsFor(proto, group, "t")...))
	eventually(t, "member b handled the moved partition's record", func() bool { return bHandled.Load() == 1 })
	moved := b.c.Stats().Partitions[0].Partition
	eventually(t, "member a's Stats drop the moved partition", func() bool {
		_, owned := a.c.partStats("t", moved)
		return !owned && len(a.c.Stats().Partitions) == 1
	})
	close(release)
	kept := 1 - moved
	tc.produce(t, rec("t", kept, "c", "1"))
	eventually(t, "member a committed its kept partition's new record", func() bool {
		cs := commits.of("t", kept)
		return len(cs) > 0 && cs[len(cs)-1].Offset == 2
	})
	for _, cm := range commits.of("t", moved) {
		if cm.Member == aMember && cm.Offset > 0 {
			t.Errorf("member a committed %d for partition %d after losing it with offset 0 unfinished", cm.Offset, moved)
		}
	}
	b.close(t)
	a.close(t)
}

// Property 8: a stuck key holds its partition's frontier and, at the
// in-flight bound, its fetching, and nothing else: other partitions go on,
// heartbeats and rebalances go on, memory stays bounded.
func TestBackpressureStuckKey(t *testing.T) {
	tc := newCluster(t, 2, "t")
	group := groupName(t)
	rs := []*kgo.Record{rec("t", 0, "stuck", "0")}
	for i := range 3000 {
		key := fmt.Sprintf("k%d", i%50)
		if i%3 == 0 {
			key = "stuck" // the stuck key's later records fill the partition's bound
		}
		rs = append(rs, rec("t", 0, key, strconv.Itoa(i)))
	}
	for i := range 300 {
		rs = append(rs, rec("t", 1, fmt.Sprintf("k%d", i%50), strconv.Itoa(i)))
	}
	tc.produce(t, rs...)
	release := make(chan struct{})
	var mu sync.Mutex
	done := map[string]bool{}
	h := func(ctx context.Context, r *kgo.Record) error {
		if string(r.Key) == "stuck" {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		mu.Lock()
		done[fmt.Sprintf("%d/%d", r.Partition, r.Offset)] = true
		mu.Unlock()
		return nil
	}
	count := func(part int32) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for k := range done {
			if k[0] == byte('0'+part) {
				n++
			}
		}
		return n
	}
	const bound, poll = 16, 8
	a := runMember(t, h, WithLogger(quiet), WithMaxInFlight(bound), WithMaxPollRecords(poll), WithRevokeTimeout(100*time.Millisecond),
		WithClientOptions(tc.clientOpts(group, "t")...))
	eventually(t, "partition 1 handled while partition 0's key is stuck", func() bool { return count(1) == 300 })
	eventually(t, "partition 0 paused at its bound", func() bool {
		ps, _ := a.c.partStats("t", 0)
		return ps.Paused && ps.InFlight > int(resumeAt(bound))
	})
	ps, _ := a.c.partStats("t", 0)
	if ps.InFlight > bound+poll || ps.HighestFetched > 3*(bound+poll) || ps.Frontier != 0 {
		t.Errorf("stuck partition: %+v: fetched past its bound", ps)
	}
	// Rebalances go on while the key is stuck.
	b := runMember(t, h, WithLogger(quiet), WithMaxInFlight(bound), WithMaxPollRecords(poll),
		WithClientOptions(tc.clientOpts(group, "t")...))
	eventually(t, "member b joined and owns a partition", func() bool { return len(b.c.Stats().Partitions) == 1 })
	close(release)
	eventually(t, "every record handled", func() bool { return count(0) == 3001 && count(1) == 300 })
	for _, m := range []*member{a, b} {
		for _, ps := range m.c.Stats().Partitions {
			if ps.Paused {
				eventually(t, "partition resumed after draining", func() bool { p, _ := m.c.partStats(ps.Topic, ps.Partition); return !p.Paused })
			}
		}
	}
	b.close(t)
	a.close(t)
}

// Property 9: Close drains until its context ends, then gives up on what
// runs: that record is neither committed nor dead-lettered, and the next
// owner handles it. Close returns soon after its context ends even though
// the revoke timeout is 9 s (just below the test cluster's 10 s rebalance
// timeout: NewConsumer refuses a longer one).
func TestCloseGivesUp(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	commits := tc.watchCommits(t)
	group := groupName(t)
	tc.produce(t, rec("t", 0, "a", "0"), rec("t", 0, "b", "0"), rec("t", 0, "c", "0"))
	var started atomic.Bool
	var others atomic.Int64
	a, err := NewConsumer(func(ctx context.Context, r *kgo.Record) error {
		if r.Offset == 1 {
			started.Store(true)
			<-ctx.Done()
			return ctx.Err()
		}
		others.Add(1)
		return nil
	}, WithLogger(quiet), WithRevokeTimeout(9*time.Second), WithDeadLetterTopic("dlq"), WithCommitInterval(time.Hour),
		WithClientOptions(tc.clientOpts(group, "t")...))
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- a.Run(context.Background()) }()
	eventually(t, "offset 1 running, 0 and 2 handled", func() bool { return started.Load() && others.Load() == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err = a.Close(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close: %v, want DeadlineExceeded", err)
	}
	if d := time.Since(t0); d > 30*time.Second {
		t.Errorf("Close took %v with a one-minute revoke timeout", d)
	}
	if err := <-runDone; err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := a.Close(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second Close: %v, want the first one's result", err)
	}
	cs := commits.of("t", 0)
	if len(cs) == 0 || cs[len(cs)-1].Offset != 1 {
		t.Fatalf("commits %+v: want a final commit of 1", cs)
	}
	if st := a.Stats(); st.DeadLettered != 0 || len(st.Partitions) != 0 {
		t.Errorf("after Close: %+v", st)
	}
	if n := tc.endOffset(t, "dlq", 0); n != 0 {
		t.Errorf("the interrupted record was dead-lettered (%d records)", n)
	}
	var got atomic.Int64
	got.Store(-1)
	b := runMember(t, func(ctx context.Context, r *kgo.Record) error { got.CompareAndSwap(-1, r.Offset); return nil },
		WithLogger(quiet), WithClientOptions(tc.clientOpts(group, "t")...))
	eventually(t, "the next owner handles offset 1", func() bool { return got.Load() == 1 })
	b.close(t)
	if err := a.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close: %v", err)
	}
}

// An interval commit that franz-go keeps retrying (every OffsetCommit of
// the group answered COORDINATOR_NOT_AVAILABLE) must not hold a rebalance:
// franz-go does not join while a CommitOffsetsSync is in flight. Input that
// broke it: member a committing every 20 ms into that fault, member b
// joining: the interval commit, bounded only by 30 s, held a's rejoin past
// the 10 s rebalance timeout (b got no partition within 8 s; the group
// then drops a, and its handled records are handled again).
func TestRebalanceNotHeldByFailingIntervalCommits(t *testing.T) {
	tc := newCluster(t, 2, "t")
	group := groupName(t)
	tc.produceSpread(t, "t", 2, 20)
	f := tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.CoordinatorNotAvailable, Count: -1})
	a := runMember(t, func(context.Context, *kgo.Record) error { return nil }, WithLogger(quiet),
		WithCommitInterval(20*time.Millisecond), WithRevokeTimeout(time.Second), WithClientOptions(tc.clientOptsFor(protoCooperative, group, "t")...))
	eventually(t, "member a handled everything, its commits failing", func() bool { return a.c.Stats().Finished == 20 && f.Hits() >= 2 })
	b := runMember(t, func(context.Context, *kgo.Record) error { return nil }, WithLogger(quiet),
		WithCommitInterval(time.Hour), WithClientOptions(tc.clientOptsFor(protoCooperative, group, "t")...))
	eventuallyWithin(t, 8*time.Second, "member b owns a partition (the rebalance timeout is 10 s)", func() bool { return len(b.c.Stats().Partitions) == 1 })
	for _, m := range []*member{b, a} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_ = m.c.Close(ctx) // the commits fail for good: Close says so (tested elsewhere)
		cancel()
		if err := <-m.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

// Rebalances while the poll loop waits for room (partitions at a small
// in-flight bound, handlers slow enough that it waits after nearly every
// poll, tens of waits while a member joins and another leaves), under each
// group protocol: the loop never waits on a partition it no longer owns,
// no record is lost, a key's records are handled in order across owners,
// and Close and Run return nil.
func TestRebalanceWhileWaitingForRoom(t *testing.T) {
	for _, proto := range groupProtocols {
		t.Run(string(proto), func(t *testing.T) {
			tc := newCluster(t, 2, "t")
			group := groupName(t)
			check := tc.expectProtocol(t, group, proto)
			var rs []*kgo.Record
			perKey := map[string]int{}
			var keys []string
			for i := range 1200 {
				part := int32(i % 2)
				k := fmt.Sprintf("k%d", i%24)
				sk := fmt.Sprintf("t/%d/%s", part, k)
				if perKey[sk] == 0 {
					keys = append(keys, sk)
				}
				rs = append(rs, rec("t", part, k, strconv.Itoa(perKey[sk])))
				perKey[sk]++
			}
			tc.produce(t, rs...)
			s := newSeqTracker()
			h := s.handler(2 * time.Millisecond)
			opts := []Option{WithLogger(quiet), WithMaxInFlight(10), WithMaxPollRecords(20),
				WithClientOptions(tc.clientOptsFor(proto, group, "t")...)}
			a := runMember(t, h, opts...)
			eventually(t, "member a handling records", func() bool { return s.handled.Load() > 100 })
			b := runMember(t, h, opts...)
			eventually(t, "member b owns a partition", func() bool { return len(b.c.Stats().Partitions) == 1 })
			a.close(t)
			eventually(t, "every record handled", func() bool { return s.allFinished(keys, perKey) })
			if st := b.c.Stats(); st.InFlight != 0 || st.Held != 0 || len(st.Partitions) != 2 {
				t.Errorf("member b after every record: in flight %d, held %d, %d partitions; want 0, 0, 2", st.InFlight, st.Held, len(st.Partitions))
			}
			b.close(t)
			check()
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, x := range s.bad {
				t.Error(x)
			}
		})
	}
}
