package kafka

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Property 2: every commit made while offset 2 is unfinished is at most 2,
// commits never go down, the final one is 10.
func TestCommitFrontier(t *testing.T) {
	tc := newCluster(t, 1, "t")
	commits := tc.watchCommits(t)
	var rs []*kgo.Record
	for i := range 10 {
		rs = append(rs, rec("t", 0, fmt.Sprintf("key%d", i), fmt.Sprint(i)))
	}
	tc.produce(t, rs...)
	release := make(chan struct{})
	var handled atomic.Int64
	h := func(ctx context.Context, r *kgo.Record) error {
		if r.Offset == 2 {
			<-release
		}
		handled.Add(1)
		return nil
	}
	c := startConsumer(t, h, WithLogger(quiet), WithCommitInterval(5*time.Millisecond),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "nine records handled", func() bool { return handled.Load() == 9 })
	eventually(t, "a commit of 2 listing 3-9 as finished", func() bool {
		cs := commits.of("t", 0)
		return len(cs) > 0 && cs[len(cs)-1].Offset == 2 && fmt.Sprint(decodeFinished(cs[len(cs)-1].Metadata, 2)) == "[{3 9}]"
	})
	if ps, _ := c.partStats("t", 0); ps.Frontier != 2 || ps.InFlight != 1 || ps.HighestFetched != 9 {
		t.Errorf("while offset 2 runs: %+v, want frontier 2, in flight 1, highest 9", ps)
	}
	for _, cm := range commits.of("t", 0) {
		if cm.Offset > 2 {
			t.Fatalf("committed %d while offset 2 was unfinished", cm.Offset)
		}
	}
	close(release)
	eventually(t, "commit of 10", func() bool {
		cs := commits.of("t", 0)
		return len(cs) > 0 && cs[len(cs)-1].Offset == 10
	})
	prev := int64(-1)
	for _, cm := range commits.of("t", 0) {
		if cm.Offset < prev {
			t.Fatalf("commit went down: %d after %d", cm.Offset, prev)
		}
		prev = cm.Offset
	}
	// The watcher sees the commit request before the consumer has its
	// response: Stats' Committed follows once the broker answered.
	eventually(t, "Stats after the commit of 10", func() bool {
		ps, _ := c.partStats("t", 0)
		return ps.Committed == 10 && ps.Frontier == 10 && ps.InFlight == 0
	})
}

// Offsets that never arrive (transaction markers) do not stall the frontier.
func TestFrontierSkipsGaps(t *testing.T) {
	tc := newCluster(t, 1, "t")
	commits := tc.watchCommits(t)
	pcl, err := kgo.NewClient(kgo.SeedBrokers(tc.addrs...), kgo.TransactionalID("tx"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for batch := range 3 {
		if err := pcl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if err := pcl.ProduceSync(ctx, rec("t", 0, fmt.Sprint(i), fmt.Sprint(batch))).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := pcl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
	pcl.Close()
	// Offsets: 0 1 [marker 2] 3 4 [marker 5] 6 7 [marker 8].
	var offsets []int64
	var n atomic.Int64
	h := func(ctx context.Context, r *kgo.Record) error {
		offsets = append(offsets, r.Offset) // PartitionOrder: one at a time
		n.Add(1)
		return nil
	}
	c := startConsumer(t, h, WithLogger(quiet), WithOrdering(PartitionOrder), WithCommitInterval(5*time.Millisecond),
		WithClientOptions(append(tc.clientOpts(groupName(t), "t"), kgo.FetchIsolationLevel(kgo.ReadCommitted()))...))
	eventually(t, "six records handled", func() bool { return n.Load() == 6 })
	eventually(t, "commit past the last record", func() bool {
		cs := commits.of("t", 0)
		return len(cs) > 0 && cs[len(cs)-1].Offset >= 8
	})
	if want := []int64{0, 1, 3, 4, 6, 7}; fmt.Sprint(offsets) != fmt.Sprint(want) {
		t.Errorf("handled %v, want %v", offsets, want)
	}
	_ = c
}

// The tracker itself: offsets with holes, finished out of order.
func TestTrackerFrontier(t *testing.T) {
	c := &Consumer{}
	p := &partition{c: c, committed: -1, hwm: -1}
	if _, _, ok := p.frontier(); ok {
		t.Fatal("frontier before any record")
	}
	var items []*item
	for _, off := range []int64{3, 4, 7, 20, 21} {
		it := p.takeItem(&kgo.Record{Offset: off, LeaderEpoch: 1})
		p.seen(it.record())
		p.add(it)
		items = append(items, it)
	}
	check := func(want int64) {
		t.Helper()
		if f, _, _ := p.frontier(); f != want {
			t.Fatalf("frontier %d, want %d", f, want)
		}
	}
	check(3)
	items[2].finish() // 7
	check(3)
	items[0].finish() // 3
	check(4)
	items[1].finish() // 4: 7 done too, the hole 8-19 never arrives
	check(20)
	if meta, _ := encodeFinished(20, p.unfinished(100), true, p.highest, 100); meta != "" {
		t.Fatalf("metadata %q with nothing finished above the frontier", meta)
	}
	items[4].finish() // 21
	meta, truncated := encodeFinished(20, p.unfinished(100), true, p.highest, 100)
	if truncated || fmt.Sprint(decodeFinished(meta, 20)) != "[{21 21}]" {
		t.Fatalf("metadata %q decodes to %v", meta, decodeFinished(meta, 20))
	}
	items[3].finish()
	check(22)
	if got := p.inflight.Load(); got != 0 {
		t.Fatalf("in flight %d", got)
	}
}

// Finished records behind a stuck one do not stay in memory.
func TestTrackerCompacts(t *testing.T) {
	p := &partition{c: &Consumer{}, committed: -1, hwm: -1}
	for off := range int64(100000) {
		it := p.takeItem(&kgo.Record{Offset: off})
		p.seen(it.record())
		p.add(it)
		if off > 0 {
			it.finish()
		}
	}
	if len(p.queue) > 4096 {
		t.Fatalf("queue holds %d records with one unfinished", len(p.queue))
	}
	if f, _, _ := p.frontier(); f != 0 {
		t.Fatalf("frontier %d", f)
	}
	meta, truncated := encodeFinished(0, p.unfinished(4096), true, p.highest, 4096)
	if truncated || fmt.Sprint(decodeFinished(meta, 0)) != "[{1 99999}]" {
		t.Fatalf("metadata %q", meta)
	}
}

var _ = time.Second
