package kafka

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Partition states of one assignment.
const (
	stActive   int32 = iota // dispatching, committing
	stRevoking              // no new handler starts; running ones are waited for
	stGone                  // no longer ours: results are dropped, nothing is committed
)

// partition is one assignment of a topic partition to this member: a new
// one (a new epoch) each time it is assigned. Work is stamped with it, and
// results of work whose partition is not the current, live one are dropped.
type partition struct {
	c      *Consumer
	topic  string
	id     int32
	epoch  uint64
	ctx    context.Context // the assignment's: cancelled when it ends
	cancel context.CancelFunc

	state    atomic.Int32
	noCommit atomic.Bool  // lost: never commit
	running  atomic.Int32 // handlers and dead-letter produces running
	inflight atomic.Int64 // fetched and not finished, held back ones included
	paused   atomic.Bool  // fetching paused by this consumer

	mu            sync.Mutex
	queue         []*item           // records fetched, in offset order, from the oldest possibly unfinished
	head          int               // queue[:head] are finished and let go
	fetched       bool              // a record was seen in this assignment
	highest       int64             // offset of the highest record seen
	highestEpoch  int32             // its leader epoch
	hwm           int64             // high watermark of the last fetch, -1 unknown
	committed     int64             // last committed offset, -1 none
	committedMeta string            // and its metadata
	held          []*group          // groups waiting for room in the scheduler, in offset order per key
	polls         uint64            // polls routed
	last          map[string]*group // the last group of each key (KeyOrder; finished ones swept now and then)
	lastNil       *group            // the last group of the nil key (of the partition, under PartitionOrder)
	lastSweep     int               // sweep p.last when it grows past this
	scratch       []*group          // route's
	slab          []item            // items not handed out yet (see takeItem)
	holding       bool              // len(held) > 0, as counted in Consumer.holding
	skip          []span            // offsets finished by an earlier owner (commit metadata)
	metaWarned    bool
}

func newPartition(c *Consumer, topic string, id int32, epoch uint64) *partition {
	p := &partition{c: c, topic: topic, id: id, epoch: epoch, hwm: -1, committed: -1, last: map[string]*group{}, lastSweep: 1024}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// lastOf returns the last group of a chain (p.mu held).
func (p *partition) lastOf(null bool, k string) *group {
	if null {
		return p.lastNil
	}
	return p.last[k]
}

func (p *partition) setLast(null bool, k string, g *group) {
	if null {
		p.lastNil = g
	} else {
		p.last[k] = g
	}
}

// heldRecords counts the records of held groups (p.mu held).
func (p *partition) heldRecords() int {
	n := 0
	for _, g := range p.held {
		n += len(g.items)
	}
	return n
}

// span is an inclusive range of offsets.
type span struct{ from, to int64 }

func (p *partition) active() bool { return p.state.Load() == stActive }

// add appends a fetched record (p.mu held). route does the same for a
// poll's records, but compacts before and counts them in flight after
// (once: the count is shared with the workers that finish records).
func (p *partition) add(it *item) {
	p.queue = append(p.queue, it)
	p.inflight.Add(1)
	p.compact()
}

// seen records r as fetched (p.mu held).
func (p *partition) seen(r *kgo.Record) {
	p.fetched = true
	p.highest = r.Offset
	p.highestEpoch = r.LeaderEpoch
}

// trim lets go of the finished records at the front (p.mu held).
func (p *partition) trim() {
	for p.head < len(p.queue) && p.queue[p.head].isDone() {
		p.queue[p.head] = nil
		p.head++
	}
	if p.head == len(p.queue) {
		p.queue = p.queue[:0]
		p.head = 0
	}
}

// compact keeps the queue's memory proportional to the unfinished records:
// finished records behind a stuck one are dropped from it (p.mu held).
func (p *partition) compact() {
	live := len(p.queue) - p.head
	if live < 1024 || int64(live) < 2*p.inflight.Load()+64 {
		return
	}
	p.trim()
	q := p.queue[:0]
	for _, it := range p.queue[p.head:] {
		if !it.isDone() {
			it.detach()
			q = append(q, it)
		}
	}
	clear(p.queue[len(q):])
	p.queue, p.head = q, 0
}

// frontier returns the offset to commit: the lowest unfinished record's, or
// one past the highest seen, with the leader epoch to commit with; ok is
// false when nothing was seen yet (p.mu held).
func (p *partition) frontier() (off int64, epoch int32, ok bool) {
	p.trim()
	if p.head < len(p.queue) {
		it := p.queue[p.head]
		return it.off, it.epoch, true
	}
	if p.fetched {
		return p.highest + 1, p.highestEpoch, true
	}
	return 0, -1, false
}

// unfinished returns the offsets of unfinished records, ascending (p.mu
// held, after frontier).
func (p *partition) unfinished(limit int) []int64 {
	var out []int64
	for _, it := range p.queue[p.head:] {
		if !it.isDone() {
			out = append(out, it.off)
			if len(out) > limit {
				break
			}
		}
	}
	return out
}

// skipped reports whether an earlier owner finished off (p.mu held), and
// forgets the spans below it.
func (p *partition) skipped(off int64) bool {
	for len(p.skip) > 0 && p.skip[0].to < off {
		p.skip = p.skip[1:]
	}
	return len(p.skip) > 0 && p.skip[0].from <= off
}

// enter counts a handler or a dead-letter produce of p as running, unless p
// is no longer active (then it reports false and counts nothing).
func (p *partition) enter(allowRevoking bool) bool {
	p.running.Add(1)
	st := p.state.Load()
	if st == stActive || (allowRevoking && st == stRevoking) {
		return true
	}
	p.leave()
	return false
}

func (p *partition) leave() {
	if p.running.Add(-1) == 0 && p.state.Load() != stActive {
		select {
		case p.c.revokeWake <- struct{}{}:
		default:
		}
	}
}

// item is one fetched record on its way through the scheduler, in a group.
//
// It is 64 bytes, one cache line of its slab (takeItem): route writes it on
// the poll loop's core and a worker on another core reads and finishes it,
// so each field beyond a line would cost every record a second line moved
// between the cores (an 88-byte item did; TestItemIsOneCacheLine). Fields of
// the failure paths are pointers for that reason.
type item struct {
	p        *partition
	g        *group                     // its group (p.mu; it changes when a group hands it on)
	rec      atomic.Pointer[kgo.Record] // see detach
	off      int64                      // the record's offset
	epoch    int32                      // and leader epoch
	flags    atomic.Uint32              // itemDone, itemInterrupted
	attempts atomic.Int32
	detached bool                  // rec is a copy of its own (p.mu)
	stash    *error                // a failed attempt made in an earlier group (see group); nil: none
	lastErr  atomic.Pointer[error] // parked: the last attempt's error
}

// An item's flags.
const (
	itemDone        = 1 << iota // finished: handled, or dead-lettered
	itemInterrupted             // an attempt was cancelled (revoke timeout, Close gave up)
)

func (it *item) isDone() bool { return it.flags.Load()&itemDone != 0 }

// markDone sets itemDone; false if it was set already.
func (it *item) markDone() bool { return it.flags.Or(itemDone)&itemDone == 0 }

func (it *item) interrupt() { it.flags.Or(itemInterrupted) }

func (it *item) wasInterrupted() bool { return it.flags.Load()&itemInterrupted != 0 }

// itemChunk is how many items route allocates at once (see takeItem).
const itemChunk = 32

// takeItem returns a new item for r from p's slab (p.mu held): route takes
// its items itemChunk at a time, one allocation for them instead of one
// each (an allocation per record was a good part of the adapter's cost per
// record: its own, and the collections it made). An item kept keeps its
// chunk reachable: at most itemChunk-1 finished items (64 bytes each; their
// records are let go at finish) and their finished groups (176 bytes and a
// scheduler task each; a finished group keeps neither its items nor its
// key's next group, see group) per unfinished one, under 10 KB, so the
// memory stays proportional to the unfinished records.
func (p *partition) takeItem(r *kgo.Record) *item {
	if len(p.slab) == 0 {
		p.slab = make([]item, itemChunk)
	}
	it := &p.slab[0]
	p.slab = p.slab[1:]
	it.p, it.off, it.epoch = p, r.Offset, r.LeaderEpoch
	it.rec.Store(r)
	return it
}

// record returns the record (the original, or the copy detach made); nil
// once the record is finished.
func (it *item) record() *kgo.Record { return it.rec.Load() }

// detach replaces the record with a copy whose key, value and headers are
// allocations of their own (p.mu held). A fetched record's bytes point into
// its fetch's buffer, so one record kept unfinished for long (a stuck key's)
// would keep a whole fetch response reachable; compaction detaches the
// records that outlive it. A handler already running keeps the original.
func (it *item) detach() {
	if it.detached {
		return
	}
	it.detached = true
	orig := it.rec.Load()
	if orig == nil {
		return // finished meanwhile
	}
	r := *orig
	r.Key = bytes.Clone(r.Key)
	r.Value = bytes.Clone(r.Value)
	if len(r.Headers) > 0 {
		hs := make([]kgo.RecordHeader, len(r.Headers))
		for i, h := range r.Headers {
			hs[i] = kgo.RecordHeader{Key: strings.Clone(h.Key), Value: bytes.Clone(h.Value)}
		}
		r.Headers = hs
	}
	it.rec.Store(&r)
}

// finish marks the record finished: it now counts toward the frontier.
func (it *item) finish() {
	if !it.markDone() {
		return
	}
	it.rec.Store(nil) // its bytes (and its fetch's buffer) need not wait for the tracker
	p := it.p
	n := p.inflight.Add(-1)
	c := p.c
	c.finished.Add(1)
	// Wake the poll loop when it has something to do: held records to
	// retry (room may have appeared anywhere), this paused partition
	// drained to its resume point, or (awaitRoom) this partition fell
	// below its bound.
	if c.holding.Load() > 0 || (p.paused.Load() && n <= resumeAt(c.cfg.maxInFlight)) ||
		(n == int64(c.cfg.maxInFlight)-1 && c.awaiting.Load()) {
		c.wake()
	}
}
