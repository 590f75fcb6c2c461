package main

import (
	"context"
	"encoding/binary"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A produced record's value: the event's position in the stream (8 bytes),
// its key id (4) and its position within its key (4), big-endian. The
// handler checks a record from its own bytes and its key's state alone, as
// an application's handler reads its record and its entity: a look-up of
// the event in a table indexed by stream position would cost a consumer
// that runs events out of stream order (grouped by key) a cache miss per
// event that one running them in order does not pay (about 250 ns per event
// with per-event arrays here, 2026-12-01), the benchmark's own cost
// charged to the consumer.
const valueLen = 16

func encodeValue(seq int, id, ord int32) []byte {
	v := make([]byte, valueLen)
	binary.BigEndian.PutUint64(v, uint64(seq))
	binary.BigEndian.PutUint32(v[8:], uint32(id))
	binary.BigEndian.PutUint32(v[12:], uint32(ord))
	return v
}

// decodeValue reads a value of encodeValue; ok is false for any other.
func decodeValue(v []byte) (seq int, id, ord int32, ok bool) {
	if len(v) != valueLen {
		return 0, 0, 0, false
	}
	s := binary.BigEndian.Uint64(v)
	if s > math.MaxInt32 {
		return 0, 0, 0, false
	}
	return int(s), int32(binary.BigEndian.Uint32(v[8:])), int32(binary.BigEndian.Uint32(v[12:])), true
}

// latencySamples is how many events' latency a run samples at least: every
// event of a stream of up to that many, else about that many, picked by a
// hash of their position (a fixed stride would pick the same positions of
// every round of a --rounds stream, and a trace's periodic structure with
// them). A time stamp at poll and at handling for every event of a million
// costs two clock reads and two random writes each; 100,000 samples give
// the p99 as well. With --hot-key every event is sampled.
const latencySamples = 100_000

// countShards is how many counters the handled events are counted in (by
// key id): one counter written by every handler on every core would move
// its cache line between the cores at every event.
const countShards = 64

type countShard struct {
	n    atomic.Int64
	want int64 // the stream's events of the shard's keys
	_    [48]byte
}

// tally is one consumer run's bookkeeping.
type tally struct {
	s     *stream
	work  workSpec
	every uint64 // one event in every samples its latency (see latencySamples, sampled)
	// polled is when each sampled event was first polled, latency the ns
	// from then to the end of its first handling (by position in the
	// stream; 0 for the events not sampled).
	polled  []atomic.Int64
	latency []int64
	handled []atomic.Uint64 // a bit per event: handled once
	last    []atomic.Int32  // each key's highest position handled
	// With --hot-key alone (the time.Now calls cost a little): when each
	// event was first fetched into the client's buffer, and when its
	// (first) handler began and ended its work, Unix ns.
	hot      bool
	buffered []atomic.Int64
	began    []int64
	ended    []int64

	shards     [countShards]countShard
	remaining  atomic.Int64 // shards with events not all handled
	dups       atomic.Int64
	violations atomic.Int64
	start      atomic.Int64
	end        atomic.Int64
	all        chan struct{}

	fetchReqs, fetchedRecs atomic.Int64 // see Result
}

func newTally(s *stream, work workSpec, hot bool) *tally {
	t := &tally{s: s, work: work, every: uint64(max(1, s.n/latencySamples)), last: make([]atomic.Int32, s.keys),
		handled: make([]atomic.Uint64, (s.n+63)/64), all: make(chan struct{}),
		polled: make([]atomic.Int64, s.n), latency: make([]int64, s.n)}
	if hot {
		t.every = 1
		t.hot, t.buffered, t.began, t.ended = true, make([]atomic.Int64, s.n), make([]int64, s.n), make([]int64, s.n)
	}
	for i := range t.last {
		t.last[i].Store(-1)
	}
	for _, id := range s.ids {
		t.shards[id%countShards].want++
	}
	for i := range t.shards {
		if t.shards[i].want > 0 {
			t.remaining.Add(1)
		}
	}
	if t.remaining.Load() == 0 {
		close(t.all)
	}
	return t
}

// count returns the events handled so far (each once).
func (t *tally) count() int64 {
	n := int64(0)
	for i := range t.shards {
		n += t.shards[i].n.Load()
	}
	return n
}

// sampled reports whether event seq's latency is sampled: one in t.every,
// by a multiplicative hash of seq.
func (t *tally) sampled(seq int) bool {
	return t.every == 1 || (uint64(seq)*0x9E3779B97F4A7C15>>32)%t.every == 0
}

// markPolled notes that event seq was polled at now (Unix ns), if it is
// sampled and not polled before.
func (t *tally) markPolled(seq int, now int64) {
	if t.sampled(seq) {
		t.polled[seq].CompareAndSwap(0, now)
	}
}

// OnFetchRecordUnbuffered is the franz-go hook: a record leaves the client
// for the consumer.
func (t *tally) OnFetchRecordUnbuffered(r *kgo.Record, polled bool) {
	if !polled {
		return
	}
	seq, _, _, ok := decodeValue(r.Value)
	if !ok || seq >= t.s.n {
		return
	}
	if t.start.Load() == 0 { // a load, not a CAS per record: the line stays shared
		t.start.CompareAndSwap(0, time.Now().UnixNano())
	}
	if t.sampled(seq) { // the clock is read for the sampled events alone
		t.polled[seq].CompareAndSwap(0, time.Now().UnixNano())
	}
}

// OnBrokerWrite is the franz-go hook: a request was written to a broker.
func (t *tally) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == kmsg.Fetch.Int16() && err == nil {
		t.fetchReqs.Add(1)
	}
}

// OnFetchBatchRead is the franz-go hook: a fetched batch was decoded.
func (t *tally) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	t.fetchedRecs.Add(int64(m.NumRecords))
}

// handle is every consumer's handler: it does the work and checks the
// record against its key's state. An event handled while an earlier event
// of its key has not finished is an order violation; an event handled
// again is a duplicate.
func (t *tally) handle(_ context.Context, r *kgo.Record) error {
	seq, id, ord, ok := decodeValue(r.Value)
	if !ok || seq >= t.s.n || id < 0 || int(id) >= len(t.last) {
		return nil
	}
	if last := t.last[id].Load(); ord > last+1 {
		t.violations.Add(1) // an earlier event of the key has not finished
	}
	var began, ended int64
	if t.hot {
		began = time.Now().UnixNano()
		t.work.do()
		ended = time.Now().UnixNano()
	} else {
		t.work.do()
	}
	for {
		last := t.last[id].Load()
		if ord <= last || t.last[id].CompareAndSwap(last, ord) {
			break
		}
	}
	bit := uint64(1) << (seq % 64)
	if t.handled[seq/64].Or(bit)&bit != 0 {
		t.dups.Add(1)
		return nil
	}
	if t.hot {
		t.began[seq], t.ended[seq] = began, ended
	}
	if t.sampled(seq) {
		t.latency[seq] = time.Now().UnixNano() - t.polled[seq].Load()
	}
	if sh := &t.shards[id%countShards]; sh.n.Add(1) == sh.want && t.remaining.Add(-1) == 0 {
		t.end.Store(time.Now().UnixNano())
		close(t.all)
	}
	return nil
}

func (t *tally) result(name string) Result {
	n := t.s.n
	secs := float64(t.end.Load()-t.start.Load()) / 1e9
	lat := make([]int64, 0, n/int(t.every)+1)
	for seq, l := range t.latency {
		if t.sampled(seq) {
			lat = append(lat, l)
		}
	}
	slices.Sort(lat)
	var p99 int64
	if len(lat) > 0 {
		p99 = lat[min(len(lat)-1, int(math.Ceil(0.99*float64(len(lat))))-1)]
	}
	return Result{Consumer: name, Events: n, Seconds: secs, EventsPerSec: float64(n) / secs,
		P99us: float64(p99) / 1e3, OrderViolations: t.violations.Load(), Duplicates: t.dups.Load(),
		FetchRequests: t.fetchReqs.Load(), FetchedRecords: t.fetchedRecs.Load()}
}
