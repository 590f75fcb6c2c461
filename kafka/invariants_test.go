package kafka

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Randomised invariants of groups, on one partition with three keys: many
// small polls (so a key's groups follow one another, linked), random
// failures with retries and dead letters (or parks that a helper skips or
// resumes), panics, and a partition loss half-way. Checked: no handler of a
// key starts while another of it runs or before its earlier records are
// done (handled, dead-lettered, or being skipped), every commit is at or
// below the lowest record not done, commits never go back, and everything
// is committed at the end.
func TestGroupInvariants(t *testing.T) {
	for _, park := range []bool{false, true} {
		t.Run(fmt.Sprintf("park=%v", park), func(t *testing.T) { testGroupInvariants(t, 1, park, true) })
	}
}

func testGroupInvariants(t *testing.T, seed uint64, park, loss bool) {
	r := rand.New(rand.NewPCG(seed, 7))
	tc := newCluster(t, 1, "t", "dlq")
	const N = 300
	keys := []string{"a", "b", "c"}
	keyOf := make([]string, N)
	fails := make([]int, N)
	for i := range N {
		keyOf[i] = keys[r.IntN(len(keys))]
		if r.IntN(5) == 0 {
			fails[i] = 1 + r.IntN(4)
		}
	}
	var mu sync.Mutex
	attempts := make([]int, N)
	done := make([]bool, N)
	running := map[string]int64{}
	var bad []string
	maxA := 3
	if park {
		maxA = 2
	}
	h := func(ctx context.Context, rr *kgo.Record) error {
		o := int(rr.Offset)
		k := string(rr.Key)
		mu.Lock()
		if cur, ok := running[k]; ok {
			bad = append(bad, fmt.Sprintf("%d started while %d of key %s runs", o, cur, k))
		}
		for j := 0; j < o; j++ {
			if keyOf[j] == k && !done[j] {
				bad = append(bad, fmt.Sprintf("%d started before %d of key %s done", o, j, k))
				break
			}
		}
		running[k] = int64(o)
		attempts[o]++
		n := attempts[o]
		fail := n <= fails[o]
		if !fail || (!park && n == maxA) {
			done[o] = true
		}
		mu.Unlock()
		if r2 := rand.IntN(3); r2 == 0 {
			time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		}
		mu.Lock()
		delete(running, k)
		mu.Unlock()
		if fail {
			if n == 2 && o%7 == 0 {
				panic("p")
			}
			return fmt.Errorf("fail %d", o)
		}
		return nil
	}
	commits := tc.watchCommits(t)
	tc.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		tc.KeepControl()
		rq := req.(*kmsg.OffsetCommitRequest)
		mu.Lock()
		for _, tt := range rq.Topics {
			for _, pp := range tt.Partitions {
				for j := int64(0); j < pp.Offset && j < N; j++ {
					if !done[j] {
						bad = append(bad, fmt.Sprintf("commit %d with %d not done", pp.Offset, j))
						break
					}
				}
			}
		}
		mu.Unlock()
		return nil, nil, false
	})
	so := []keysched.Option{keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: maxA, InitialBackoff: 100 * time.Microsecond})}
	if park {
		so = append(so, keysched.WithFailurePolicy(keysched.Park))
	}
	c := startConsumer(t, h, WithLogger(quiet), WithDeadLetterTopic("dlq"), WithCommitInterval(2*time.Millisecond), WithMaxPollRecords(4),
		WithSchedulerOptions(so...), WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if park {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				for _, k := range c.Parked() {
					if i%2 == 0 {
						mu.Lock()
						done[k.Offset] = true
						mu.Unlock()
						if err := c.Skip(k); err != nil {
							if !errors.Is(err, ErrNotParked) {
								t.Errorf("skip: %v", err)
							}
							mu.Lock()
							done[k.Offset] = false
							mu.Unlock()
						}
					} else {
						_ = c.Resume(k)
					}
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	for i := 0; i < N; {
		if loss && i > N/2 {
			loss = false
			tc.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
				resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
				resp.ErrorCode = kerr.UnknownMemberID.Code
				return resp, nil, true
			})
		}
		n := min(N-i, 1+r.IntN(10))
		var rs []*kgo.Record
		for j := i; j < i+n; j++ {
			rs = append(rs, rec("t", 0, keyOf[j], fmt.Sprint(j)))
		}
		tc.produce(t, rs...)
		i += n
	}
	eventuallyWithin(t, 60*time.Second, "commit of N", func() bool {
		cs := commits.of("t", 0)
		return len(cs) > 0 && cs[len(cs)-1].Offset == N
	})
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for _, b := range bad {
		t.Error(b)
	}
	prev := int64(-1)
	for _, cm := range commits.of("t", 0) {
		if cm.Offset < prev {
			t.Errorf("commit went back %d -> %d", prev, cm.Offset)
		}
		prev = cm.Offset
	}
	if ps, _ := c.partStats("t", 0); ps.Epoch != 2 {
		t.Errorf("epoch %d: the partition was not lost and assigned again", ps.Epoch)
	}
}

// Randomised invariants across a cooperative rebalance with commits: two
// partitions, four keys, random failures with retries and dead letters; a
// second member joins a third of the way in (taking a partition from the
// first, which commits on revoke) and leaves at two thirds. Checked: no
// record of a key starts before the key's earlier records are done, no
// commit passes a record not done, every record is done.
func TestGroupInvariantsRebalance(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 9))
	tc := newCluster(t, 2, "t", "dlq")
	const N = 400
	keys := []string{"a", "b", "c", "d"}
	keyOf := make([]string, N)
	fails := make([]int, N)
	for i := range N {
		keyOf[i] = keys[r.IntN(len(keys))]
		if r.IntN(5) == 0 {
			fails[i] = 1 + r.IntN(4)
		}
	}
	part := func(k string) int32 { return int32(k[0]-'a') % 2 }
	var mu sync.Mutex
	attempts := make([]int, N)
	done := make([]bool, N)
	idx := map[[2]int64]int{}
	var bad []string
	h := func(ctx context.Context, rr *kgo.Record) error {
		o, _ := strconv.Atoi(string(rr.Value))
		k := string(rr.Key)
		mu.Lock()
		for j := 0; j < o; j++ {
			if keyOf[j] == k && !done[j] {
				bad = append(bad, fmt.Sprintf("%d started before %d of key %s done", o, j, k))
				break
			}
		}
		attempts[o]++
		n := attempts[o]
		fail := n <= fails[o]
		if !fail || n >= 3 {
			done[o] = true
		}
		mu.Unlock()
		if rand.IntN(3) == 0 {
			time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		}
		if fail {
			return fmt.Errorf("fail %d", o)
		}
		return nil
	}
	tc.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		tc.KeepControl()
		rq := req.(*kmsg.OffsetCommitRequest)
		mu.Lock()
		for _, tt := range rq.Topics {
			for _, pp := range tt.Partitions {
				for j := int64(0); j < pp.Offset; j++ {
					i, ok := idx[[2]int64{int64(pp.Partition), j}]
					if ok && !done[i] {
						bad = append(bad, fmt.Sprintf("commit %d/%d by %s with %d (offset %d, attempts %d, fails %d) not done meta %v", pp.Partition, pp.Offset, rq.MemberID, i, j, attempts[i], fails[i], pp.Metadata))
						break
					}
				}
			}
		}
		mu.Unlock()
		return nil, nil, false
	})
	commits := tc.watchCommits(t)
	group := groupName(t)
	lb := &logBuffer{}
	defer func() {
		if t.Failed() {
			t.Log(lb.String())
		}
	}()
	mk := func() *Consumer {
		return startConsumer(t, h, WithLogger(lb.logger()), WithDeadLetterTopic("dlq"), WithCommitInterval(2*time.Millisecond), WithMaxPollRecords(4),
			WithRevokeTimeout(5*time.Second),
			WithSchedulerOptions(keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: 100 * time.Microsecond})),
			WithClientOptions(tc.clientOpts(group, "t")...))
	}
	mk()
	var c2 *Consumer
	closed := false
	for i := 0; i < N; {
		if i > N/3 && c2 == nil {
			c2 = mk()
		}
		if i > 2*N/3 && c2 != nil && !closed {
			closed = true
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = c2.Close(ctx)
			cancel()
		}
		n := min(N-i, 1+r.IntN(10))
		var rs []*kgo.Record
		for j := i; j < i+n; j++ {
			rs = append(rs, rec("t", part(keyOf[j]), keyOf[j], fmt.Sprint(j)))
		}
		mu.Lock()
		mu.Unlock() //nolint:staticcheck // SA2001: a barrier: waits for the handler holding mu
		tc.produce(t, rs...)
		mu.Lock()
		for _, r := range rs {
			v, _ := strconv.Atoi(string(r.Value))
			idx[[2]int64{int64(r.Partition), r.Offset}] = v
		}
		mu.Unlock()
		i += n
	}
	end0, end1 := tc.endOffset(t, "t", 0), tc.endOffset(t, "t", 1)
	eventuallyWithin(t, 60*time.Second, "commits at the end", func() bool {
		c0, c1 := commits.of("t", 0), commits.of("t", 1)
		return len(c0) > 0 && c0[len(c0)-1].Offset == end0 && len(c1) > 0 && c1[len(c1)-1].Offset == end1
	})
	mu.Lock()
	defer mu.Unlock()
	for _, b := range bad {
		t.Error(b)
	}
	for i := range N {
		if !done[i] {
			t.Errorf("index %d never done: attempts %d", i, attempts[i])
		}
	}
}

// streamChecker holds the invariants every broker fault must leave standing
// (the fault matrix in broker_faults_test.go), over a keyed stream on topic
// "t": record i has key k<i%keys> on partition (i%keys)%parts and value i.
//
//   - order: no record of a key is handled for the first time before every
//     earlier record of that key finished;
//   - frontier: no commit passes a record not finished, and one member's
//     commits of a partition never go back;
//   - no loss: every record finishes (handled, or dead-lettered);
//   - bounded memory: no partition holds more than its in-flight bound
//     plus one poll.
//
// Record i fails its first attempt when i%11 == 3 (retried), and for good
// when permanent(i) (dead-lettered; finished when its handler returns, an
// approximation: the dead letter's acknowledgement comes later).
type streamChecker struct {
	t          *testing.T
	keys       int
	parts      int32
	permanent  func(int) bool
	inFlightMx int // bound + poll

	mu       sync.Mutex
	n        int
	seq      []int // i -> its place in its key
	byKey    map[string][]int
	offsets  map[[2]int64]int // (partition, offset) -> i
	started  []bool
	finished []bool
	last     map[string]int64 // member/partition -> last offset committed
	bad      []string
	names    map[[16]byte]string
}

func newStreamChecker(t *testing.T, keys int, parts int32) *streamChecker {
	return &streamChecker{t: t, keys: keys, parts: parts, permanent: func(int) bool { return false },
		byKey: map[string][]int{}, offsets: map[[2]int64]int{}, last: map[string]int64{}}
}

func (s *streamChecker) failf(format string, args ...any) {
	if len(s.bad) < 20 {
		s.bad = append(s.bad, fmt.Sprintf(format, args...))
	}
}

// produce writes n more records of the stream.
func (s *streamChecker) produce(tc *testCluster, n int) {
	s.t.Helper()
	var rs []*kgo.Record
	s.mu.Lock()
	for range n {
		i := s.n
		s.n++
		k := fmt.Sprintf("k%d", i%s.keys)
		s.seq = append(s.seq, len(s.byKey[k]))
		s.byKey[k] = append(s.byKey[k], i)
		s.started = append(s.started, false)
		s.finished = append(s.finished, false)
		rs = append(rs, rec("t", int32(i%s.keys)%s.parts, k, strconv.Itoa(i)))
	}
	s.mu.Unlock()
	tc.produce(s.t, rs...) // sets each record's offset (its results come in completion order)
	s.mu.Lock()
	for _, r := range rs {
		i, _ := strconv.Atoi(string(r.Value))
		s.offsets[[2]int64{int64(r.Partition), r.Offset}] = i
	}
	s.mu.Unlock()
}

// handler is the members' Handler.
func (s *streamChecker) handler(ctx context.Context, r *kgo.Record) error {
	i, err := strconv.Atoi(string(r.Value))
	if err != nil {
		return keysched.Permanent(err)
	}
	k := string(r.Key)
	s.mu.Lock()
	first := !s.started[i]
	if first {
		s.started[i] = true
		for _, e := range s.byKey[k][:s.seq[i]] {
			if !s.finished[e] {
				s.failf("order: record %d of key %s handled first before %d finished", i, k, e)
				break
			}
		}
	}
	s.mu.Unlock()
	if first && i%11 == 3 {
		return errors.New("fails once")
	}
	s.mu.Lock()
	s.finished[i] = true
	s.mu.Unlock()
	if s.permanent(i) {
		return keysched.Permanent(errors.New("fails for good"))
	}
	return nil
}

// watch checks every commit request as the broker receives it (install
// again on a restarted cluster).
func (s *streamChecker) watch(tc *testCluster) {
	s.mu.Lock()
	if s.names == nil {
		s.mu.Unlock()
		names := tc.topicNames(s.t)
		s.mu.Lock()
		s.names = names
	}
	s.mu.Unlock()
	tc.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		tc.KeepControl()
		r := req.(*kmsg.OffsetCommitRequest)
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, rt := range r.Topics {
			if rt.Topic != "t" && s.names[rt.TopicID] != "t" {
				continue
			}
			for _, rp := range rt.Partitions {
				mk := fmt.Sprintf("%s/%d", r.MemberID, rp.Partition)
				if prev, ok := s.last[mk]; ok && rp.Offset < prev {
					s.failf("frontier: member %s committed %d after %d", mk, rp.Offset, prev)
				}
				s.last[mk] = rp.Offset
				for o := int64(0); o < rp.Offset; o++ {
					if i, ok := s.offsets[[2]int64{int64(rp.Partition), o}]; ok && !s.finished[i] {
						s.failf("frontier: commit %d of partition %d passes record %d (offset %d), not finished", rp.Offset, rp.Partition, i, o)
						break
					}
				}
			}
		}
		return nil, nil, false
	})
}

// sample checks the in-flight bound of c's partitions.
func (s *streamChecker) sample(c *Consumer) {
	for _, ps := range c.Stats().Partitions {
		if ps.InFlight > s.inFlightMx {
			s.mu.Lock()
			s.failf("memory: partition %d holds %d records in flight, bound %d", ps.Partition, ps.InFlight, s.inFlightMx)
			s.mu.Unlock()
		}
	}
}

// allFinished reports whether every record produced finished.
func (s *streamChecker) allFinished() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.finished {
		if !f {
			return false
		}
	}
	return true
}

// committedAtEnd reports whether the group committed every partition's end
// offset on the broker.
func (s *streamChecker) committedAtEnd(tc *testCluster, group string) bool {
	for p := range s.parts {
		if tc.committedOffset(s.t, group, "t", p) != tc.endOffset(s.t, "t", p) {
			return false
		}
	}
	return true
}

// report fails the test with what went wrong.
func (s *streamChecker) report() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.bad {
		s.t.Error(b)
	}
	for i, f := range s.finished {
		if !f {
			s.t.Errorf("loss: record %d never finished", i)
		}
	}
}

// handledAny reports whether a record was handled.
func (s *streamChecker) handledAny() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.finished {
		if f {
			return true
		}
	}
	return false
}

// permanents counts the records that fail for good.
func (s *streamChecker) permanents() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for i := range s.n {
		if s.permanent(i) {
			n++
		}
	}
	return n
}
