package kafka

import (
	"errors"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kgo"
)

func (c *Consumer) keyOf(r *kgo.Record) schedKey {
	switch c.cfg.ordering {
	case PartitionOrder:
		return schedKey{topic: r.Topic, part: r.Partition, off: -1}
	case Unordered:
		return schedKey{topic: r.Topic, part: r.Partition, off: r.Offset}
	}
	return schedKey{topic: r.Topic, part: r.Partition, null: r.Key == nil, key: string(r.Key), off: -1}
}

// route takes one partition's records from a poll: each record is tracked,
// and put into its chain's group for this poll; the groups are submitted, or
// held when the scheduler has no room.
func (c *Consumer) route(fp kgo.FetchTopicPartition) {
	p := c.lookup(fp.Topic, fp.Partition)
	if p == nil || !p.active() {
		return // not ours (any more): the owner fetches them
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.active() {
		return
	}
	p.hwm = fp.HighWatermark
	p.polls++
	// Before this poll's records join the queue: compaction copies the
	// unfinished records out of their fetch's buffer (detach), which
	// records about to be dispatched do not need.
	p.compact()
	groups := p.scratch[:0]
	consumed := 0
	if c.metrics != nil {
		defer func() { c.metrics.consumedN(fp.Topic, fp.Partition, consumed) }()
	}
	for _, r := range fp.Records {
		if p.fetched && r.Offset <= p.highest {
			continue // fetched again: already tracked
		}
		if len(p.skip) > 0 && p.skipped(r.Offset) {
			p.seen(r)
			c.skippedMeta.Add(1)
			continue
		}
		p.seen(r)
		consumed++
		it := p.takeItem(r)
		p.queue = append(p.queue, it)
		groups = c.addTo(p, groups, it, r)
	}
	p.inflight.Add(int64(consumed)) // before any of them is dispatched
	for _, g := range groups {
		if len(p.held) > 0 || !c.dispatch(g) {
			p.held = append(p.held, g)
		}
	}
	clear(groups)
	p.scratch = groups[:0]
	c.fetched.Add(uint64(consumed))
	p.sweepLast()
	c.adjustPause(p)
}

// dispatch submits g without waiting; false when its key or the scheduler
// is full (or closing).
func (c *Consumer) dispatch(g *group) bool {
	comp, err := c.sched.TrySubmit(g, g.key, runGroup)
	if err != nil {
		c.submitError(g, err)
		return false
	}
	g.comp.Store(comp)
	return true
}

func (c *Consumer) submitError(g *group, err error) {
	if !errors.Is(err, keysched.ErrKeyFull) && !errors.Is(err, keysched.ErrFull) && !errors.Is(err, keysched.ErrClosed) {
		c.log.Error("kafka: cannot submit records", "topic", g.p.topic, "partition", g.p.id, "records", len(g.items), "err", err)
	}
}
