package kafka

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kgo"
)

// liveHeap is the live heap at the end of the last GC, in bytes.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// Property 8, memory: one key stuck on partition 0's first record, and N
// records behind it on the same partition (every stuckEvery-th one of the
// stuck key, 2,500 in all, the rest of 1,000 other keys). The other keys'
// records are fetched and handled while the key is stuck (its records fill
// more than half the in-flight bound: the partition resumes nevertheless);
// the partition's in-flight count never passes the bound plus one poll, and
// the live heap's growth stays bounded, whatever N.
//
// N is 60,000 here (a few seconds); KEYSCHED_KAFKA_STUCK_RECORDS sets
// another (the README's figure: 1,000,000).
func TestStuckKeyBoundedMemory(t *testing.T) {
	n := 60_000
	if v := os.Getenv("KEYSCHED_KAFKA_STUCK_RECORDS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1000 {
			t.Fatalf("KEYSCHED_KAFKA_STUCK_RECORDS=%q: want a number >= 1000", v)
		}
	}
	// 2,500 of the stuck key's records, spread evenly: more than half the
	// in-flight bound (the partition still fetches for the other keys),
	// less than seven eighths.
	stuckEvery := n / 2500
	const (
		bound      = 4096
		poll       = 1000
		valueBytes = 2048
		// The bound on the live heap's growth while the records stream
		// past the stuck key: the stuck key's records, one poll, the
		// client's fetch buffers. Holding every record would take N x
		// (2048 + ~300) bytes: 141 MB for N = 60,000.
		maxGrowth = 48 << 20
	)
	tc := newCluster(t, 1, "t")
	pcl, err := kgo.NewClient(kgo.SeedBrokers(tc.addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(50_000))
	if err != nil {
		t.Fatal(err)
	}
	value := make([]byte, valueBytes)
	var perr atomic.Pointer[error]
	var wg sync.WaitGroup
	for i := range n {
		key := "stuck"
		if i%stuckEvery != 0 {
			key = fmt.Sprintf("k%d", i%1000)
		}
		wg.Add(1)
		pcl.Produce(context.Background(), &kgo.Record{Topic: "t", Partition: 0, Key: []byte(key), Value: value}, func(_ *kgo.Record, err error) {
			if err != nil {
				perr.CompareAndSwap(nil, &err)
			}
			wg.Done()
		})
	}
	wg.Wait()
	pcl.Close()
	if e := perr.Load(); e != nil {
		t.Fatal(*e)
	}
	stuckTotal := int64((n + stuckEvery - 1) / stuckEvery)

	runtime.GC()
	base := liveHeap()
	release := make(chan struct{})
	var handled atomic.Int64
	h := func(ctx context.Context, r *kgo.Record) error {
		if string(r.Key) == "stuck" {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		handled.Add(1)
		return nil
	}
	c := startConsumer(t, h, WithLogger(quiet), WithMaxInFlight(bound), WithMaxPollRecords(poll),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	var peak uint64
	var maxInFlight, maxHeld int
	sample := func() {
		peak = max(peak, liveHeap())
		if ps, ok := c.partStats("t", 0); ok {
			maxInFlight, maxHeld = max(maxInFlight, ps.InFlight), max(maxHeld, ps.Held)
		}
	}
	wait := time.Duration(n/60_000+1) * 30 * time.Second // a generous bound, never a result
	eventuallyWithin(t, wait, "every record but the stuck key's handled", func() bool {
		sample()
		return handled.Load() == int64(n)-stuckTotal
	})
	runtime.GC()
	sample()
	ps, _ := c.partStats("t", 0)
	if ps.Frontier != 0 || ps.InFlight != int(stuckTotal) {
		t.Errorf("with the key stuck: %+v, want frontier 0 and %d in flight", ps, stuckTotal)
	}
	if maxInFlight > bound+poll || maxHeld > poll {
		t.Errorf("in flight reached %d, held %d: want at most %d + %d", maxInFlight, maxHeld, bound, poll)
	}
	growth := int64(peak) - int64(base)
	t.Logf("%d records behind a stuck key: live heap %d MiB before, peak %d MiB (growth %d MiB); in flight at most %d",
		n, base>>20, peak>>20, growth>>20, maxInFlight)
	if growth > maxGrowth {
		t.Errorf("live heap grew by %d MiB with %d records behind a stuck key; want under %d MiB", growth>>20, n, maxGrowth>>20)
	}
	close(release)
	eventuallyWithin(t, wait, "the stuck key's records handled once released", func() bool { return handled.Load() == int64(n) })
	eventually(t, "the frontier at the end", func() bool {
		ps, _ := c.partStats("t", 0)
		return ps.Frontier == int64(n) && ps.InFlight == 0
	})
}

// Finished records must not stay reachable through the groups the
// partition keeps: p.last keeps each key's last group (a partition with
// fewer keys than its sweep threshold never forgets them), and the
// scheduler's chain of a busy key keeps its first task, whose context is its
// group. Here each of 50 polls of 1,000 records brings a key seen then and
// never again, and two records of each of 500 other keys; every group is
// made while its key's previous one is unfinished. Once all are finished,
// no group of the 500 keys made between the first and the last poll may stay reachable: all
// of them did through the next links, and, with items allocated in chunks
// (takeItem), a once-seen key's group kept its poll's items and groups
// through its first item.
func TestFinishedGroupsKeepNoRecordsReachable(t *testing.T) {
	const (
		polls = 50
		batch = 1000
	)
	c := &Consumer{cfg: defaultConfig(), parts: map[tp]*partition{}, runCtx: context.Background(), log: quiet}
	c.cfg.maxInFlight = 1 << 30
	s, err := keysched.New[schedKey](keysched.WithLogger(quiet), keysched.WithMaxKeyDepth(1<<30), keysched.WithMaxPending(1<<30))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()
	c.sched = s
	release := make(chan struct{})
	c.h = func(ctx context.Context, r *kgo.Record) error {
		<-release // every group unfinished while the next ones are made: each gets a next
		return nil
	}
	p := newPartition(c, "t", 0, 1)
	c.parts[tp{"t", 0}] = p
	keys := make([][]byte, 500) // with the once-seen ones, fewer than 1024: p.last is never swept
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "k%d", i)
	}
	// The 500 keys' groups of every poll but the first (the scheduler may
	// keep a key's first task, and with it its group, while the key's
	// chain lives) and the last (in p.last).
	var early []weak.Pointer[group]
	for n := range polls {
		rs := make([]*kgo.Record, 0, batch)
		for i := range batch {
			key := keys[i*263%len(keys)] // each key twice, spread over the poll
			if i == batch-1 {
				key = fmt.Appendf(nil, "once-%d", n) // its chunk holds second records: their groups' first items are in others
			}
			rs = append(rs, &kgo.Record{Topic: "t", Key: key, Offset: int64(n*batch + i)})
		}
		c.route(kgo.FetchTopicPartition{Topic: "t", FetchPartition: kgo.FetchPartition{Records: rs}})
		if n > 0 && n < polls-1 {
			p.mu.Lock()
			seen := map[*group]bool{}
			for _, it := range p.queue[len(p.queue)-batch : len(p.queue)-1] {
				if !seen[it.g] {
					seen[it.g] = true
					early = append(early, weak.Make(it.g))
				}
			}
			p.mu.Unlock()
		}
	}
	close(release)
	if err := s.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	if f, _, _ := p.frontier(); f != polls*batch {
		t.Fatalf("frontier %d, want %d", f, polls*batch)
	}
	if len(p.last) != len(keys)+polls || len(early) != len(keys)*(polls-2) {
		t.Fatalf("p.last holds %d keys, want %d; %d early groups, want %d: the test does not test what it says",
			len(p.last), len(keys)+polls, len(early), len(keys)*(polls-2))
	}
	p.mu.Unlock()
	runtime.GC()
	alive := 0
	for _, w := range early {
		if w.Value() != nil {
			alive++
		}
	}
	runtime.KeepAlive(p) // the partition (its p.last) is what must not keep them
	if alive > 0 {
		t.Errorf("%d of the %d groups made between the first and the last poll, all finished, are still reachable", alive, len(early))
	}
}
