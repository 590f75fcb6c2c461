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

// tally is one consumer run's bookkeeping.
type tally struct {
	s    *stream
	work workSpec
	// ev is each event's bookkeeping, one 32-byte entry per event: a
	// handler touches one cache line for its event (and one for its key's
	// last), in whatever order the consumer runs the events. Separate
	// arrays per field cost an adapter that runs events out of stream
	// order a cache miss per array per event (about 250 ns per event here,
	// 2026-12-01), which a consumer that runs them in order does not pay.
	ev []evState
	// With --hot-key alone (the time.Now calls cost a little): when each
	// event was first fetched into the client's buffer, and when its
	// (first) handler began and ended its work, Unix ns.
	hot      bool
	buffered []atomic.Int64
	began    []int64
	ended    []int64
	last     []atomic.Int32
	// count is written by every handler: a cache line of its own, so that
	// the fields every record reads (start, in the fetch hook) stay shared
	// in the cores' caches instead of moving with it.
	_          [64]byte
	count      atomic.Int64
	_          [64]byte
	dups       atomic.Int64
	violations atomic.Int64
	start      atomic.Int64
	end        atomic.Int64
	all        chan struct{}

	fetchReqs, fetchedRecs atomic.Int64 // see Result
}

func newTally(s *stream, work workSpec, hot bool) *tally {
	t := &tally{s: s, work: work, ev: make([]evState, s.n), last: make([]atomic.Int32, s.keys), all: make(chan struct{})}
	for i := range t.ev {
		t.ev[i].id, t.ev[i].ord = s.ids[i], s.ord[i]
	}
	for i := range t.last {
		t.last[i].Store(-1)
	}
	if hot {
		t.hot, t.buffered, t.began, t.ended = true, make([]atomic.Int64, s.n), make([]int64, s.n), make([]int64, s.n)
	}
	return t
}

// evState is one event's bookkeeping in a run.
type evState struct {
	polled  atomic.Int64 // when the event was first polled, Unix ns
	latency int64        // ns from polled to the end of its first handling
	id, ord int32        // the stream's key id and position within the key
	handled atomic.Bool
}

// OnFetchRecordUnbuffered is the franz-go hook: a record leaves the client
// for the consumer.
func (t *tally) OnFetchRecordUnbuffered(r *kgo.Record, polled bool) {
	if !polled || len(r.Value) != 8 {
		return
	}
	now := time.Now().UnixNano()
	if t.start.Load() == 0 { // a load, not a CAS per record: the line stays shared
		t.start.CompareAndSwap(0, now)
	}
	seq := binary.BigEndian.Uint64(r.Value)
	if seq < uint64(len(t.ev)) {
		t.ev[seq].polled.CompareAndSwap(0, now)
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

func (t *tally) handle(_ context.Context, r *kgo.Record) error {
	if len(r.Value) != 8 {
		return nil
	}
	seq := binary.BigEndian.Uint64(r.Value)
	if seq >= uint64(len(t.ev)) {
		return nil
	}
	e := &t.ev[seq]
	id, ord := e.id, e.ord
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
	if e.handled.Swap(true) {
		t.dups.Add(1)
		return nil
	}
	now := time.Now().UnixNano()
	if t.hot {
		t.began[seq], t.ended[seq] = began, ended
	}
	e.latency = now - e.polled.Load()
	if t.count.Add(1) == int64(t.s.n) {
		t.end.Store(now)
		close(t.all)
	}
	return nil
}

func (t *tally) result(name string) Result {
	n := t.s.n
	secs := float64(t.end.Load()-t.start.Load()) / 1e9
	lat := make([]int64, n)
	for i := range t.ev {
		lat[i] = t.ev[i].latency
	}
	slices.Sort(lat)
	p99 := lat[min(n-1, int(math.Ceil(0.99*float64(n)))-1)]
	return Result{Consumer: name, Events: n, Seconds: secs, EventsPerSec: float64(n) / secs,
		P99us: float64(p99) / 1e3, OrderViolations: t.violations.Load(), Duplicates: t.dups.Load(),
		FetchRequests: t.fetchReqs.Load(), FetchedRecords: t.fetchedRecs.Load()}
}
