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
