package kafka

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Property 1: records of one (topic, partition, key) run one at a time in
// offset order; different keys of a partition run concurrently; nil keys
// share one chain per partition; the same key bytes in two topics are two
// keys.
func TestOrderPerKey(t *testing.T) {
	tc := newCluster(t, 2, "a", "b")
	var rs []*kgo.Record
	keys := []string{"k0", "k1", "k2", "k3", "\x00nil", ""}
	for i := range 300 {
		for _, topic := range []string{"a", "b"} {
			rs = append(rs, rec(topic, int32(i%2), keys[i%len(keys)], fmt.Sprint(i)))
		}
	}
	// The gate records: "a"/0 key "x" waits until "b"/0 key "x" has started
	// (two topics, two keys), and "a"/1 key "y" waits until "a"/1 key "z"
	// started (two keys of one partition run at once).
	rs = append(rs, rec("a", 0, "x", "gate"), rec("b", 0, "x", "open"),
		rec("a", 1, "y", "gate2"), rec("a", 1, "z", "open2"))
	want := tc.produce(t, rs...)

	type chain struct {
		topic string
		part  int32
		null  bool
		key   string
	}
	var (
		mu      sync.Mutex
		running = map[chain]bool{}
		last    = map[chain]int64{}
		seen    = map[string]bool{}
		bad     []string
	)
	open := make(chan struct{})
	open2 := make(chan struct{})
	h := func(ctx context.Context, r *kgo.Record) error {
		ch := chain{r.Topic, r.Partition, r.Key == nil, string(r.Key)}
		mu.Lock()
		if running[ch] {
			bad = append(bad, fmt.Sprintf("%v: two records at once", ch))
		}
		if l, ok := last[ch]; ok && r.Offset <= l {
			bad = append(bad, fmt.Sprintf("%v: offset %d after %d", ch, r.Offset, l))
		}
		running[ch], last[ch] = true, r.Offset
		seen[fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)] = true
		mu.Unlock()
		switch string(r.Value) {
		case "gate":
			select {
			case <-open:
			case <-time.After(20 * time.Second):
				mu.Lock()
				bad = append(bad, "the same key bytes in topic b never ran while topic a's was running")
				mu.Unlock()
			}
		case "open":
			close(open)
		case "gate2":
			select {
			case <-open2:
			case <-time.After(20 * time.Second):
				mu.Lock()
				bad = append(bad, "another key of the partition never ran while key y was running")
				mu.Unlock()
			}
		case "open2":
			close(open2)
		}
		mu.Lock()
		running[ch] = false
		mu.Unlock()
		return nil
	}
	startConsumer(t, h, WithLogger(quiet), WithClientOptions(tc.clientOpts(groupName(t), "a", "b")...))
	eventually(t, "every record handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == len(want)
	})
	mu.Lock()
	defer mu.Unlock()
	for _, b := range bad {
		t.Error(b)
	}
}

// PartitionOrder: the records of a partition run one at a time in offset
// order, whatever their keys.
func TestPartitionOrder(t *testing.T) {
	tc := newCluster(t, 2, "t")
	var rs []*kgo.Record
	for i := range 400 {
		rs = append(rs, rec("t", int32(i%2), fmt.Sprintf("k%d", i%7), fmt.Sprint(i)))
	}
	tc.produce(t, rs...)
	var mu sync.Mutex
	running := map[int32]bool{}
	last := map[int32]int64{0: -1, 1: -1}
	n := 0
	var bad []string
	h := func(ctx context.Context, r *kgo.Record) error {
		mu.Lock()
		if running[r.Partition] || r.Offset != last[r.Partition]+1 {
			bad = append(bad, fmt.Sprintf("partition %d: offset %d after %d (running: %v)", r.Partition, r.Offset, last[r.Partition], running[r.Partition]))
		}
		running[r.Partition], last[r.Partition] = true, r.Offset
		mu.Unlock()
		time.Sleep(10 * time.Microsecond) // work, so that overlaps would show
		mu.Lock()
		running[r.Partition] = false
		n++
		mu.Unlock()
		return nil
	}
	startConsumer(t, h, WithLogger(quiet), WithOrdering(PartitionOrder), WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "every record handled", func() bool { mu.Lock(); defer mu.Unlock(); return n == 400 })
	mu.Lock()
	defer mu.Unlock()
	for _, b := range bad {
		t.Error(b)
	}
}

// Unordered: records of one key may run at once; all are handled and the
// frontier still covers them.
func TestUnordered(t *testing.T) {
	tc := newCluster(t, 1, "t")
	tc.produce(t, rec("t", 0, "k", "0"), rec("t", 0, "k", "1"), rec("t", 0, "k", "2"))
	both := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	running := 0
	n := 0
	c := startConsumer(t, func(ctx context.Context, r *kgo.Record) error {
		mu.Lock()
		running++
		if running == 2 {
			once.Do(func() { close(both) })
		}
		mu.Unlock()
		if r.Offset < 2 {
			select { // offsets 0 and 1, same key, wait for each other
			case <-both:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		mu.Lock()
		running--
		n++
		mu.Unlock()
		return nil
	}, WithLogger(quiet), WithOrdering(Unordered), WithCommitInterval(5*time.Millisecond),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "all three handled and committed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		ps, _ := c.partStats("t", 0)
		return n == 3 && ps.Committed == 3
	})
}
