package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/keysched/keysched/internal/durations"
	"github.com/keysched/keysched/internal/trace"
)

// workload is what every rival replays: the stream, indexed, and the
// handler model.
type workload struct {
	events []trace.Event
	ids    []int32  // ids[i]: dense number of events[i].Key
	keys   []string // keys[id]: the key
	final  []string // final[id]: the key's state after a sequential replay
	zero   []bool   // zero[i]: events[i].PrevBlob is all zeros (absent key)
	// neighbour[id]: key id shares the slow key's lane under striped (and is
	// not the slow key). Set by markNeighbours; nil when there is no slow key.
	neighbour []bool

	work       workSpec
	slowID     int32 // id of the slow key, or -1
	slowFactor float64
	rate       float64 // events per second, 0 = as fast as admission allows
}

func newWorkload(events []trace.Event, work workSpec, slowKey string, slowFactor, rate float64) *workload {
	w := &workload{events: events, work: work, slowID: -1, slowFactor: slowFactor, rate: rate}
	w.ids, w.keys = trace.KeyIDs(events)
	w.final = make([]string, len(w.keys))
	w.zero = make([]bool, len(events))
	for i := range events {
		w.final[w.ids[i]] = events[i].NextBlob
		w.zero[i] = trace.IsZero(events[i].PrevBlob)
	}
	if slowKey != "" {
		for id, k := range w.keys {
			if k == slowKey {
				w.slowID = int32(id)
				break
			}
		}
	}
	return w
}

// markNeighbours marks the slow key's neighbours: the keys that striped, with
// n lanes hashed under seed, puts on the slow key's lane. It returns how many
// keys that is.
func (w *workload) markNeighbours(seed uint64, n int) int {
	w.neighbour = make([]bool, len(w.keys))
	if w.slowID < 0 {
		return 0
	}
	lane := laneOf(seed, n, w.keys[w.slowID])
	count := 0
	for id, k := range w.keys {
		if int32(id) != w.slowID && laneOf(seed, n, k) == lane {
			w.neighbour[id] = true
			count++
		}
	}
	return count
}

// result is one rival's row. The JSON names are keybench's output format.
type result struct {
	Scheduler    string  `json:"scheduler"`
	Events       int     `json:"events"`
	Keys         int     `json:"keys"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	P50us        float64 `json:"p50_us"`
	P99us        float64 `json:"p99_us"`
	P999us       float64 `json:"p999_us"`
	ColdP99us    float64 `json:"cold_p99_us"`
	// NeighbourP99us is the p99 latency of the events of the slow key's
	// neighbours (see markNeighbours); 0 when there are none.
	NeighbourP99us  float64 `json:"neighbour_p99_us"`
	NeighbourEvents int     `json:"neighbour_events"`
	// Seed is the run's --seed (striped's lane hash).
	Seed            uint64  `json:"seed"`
	OrderViolations int64   `json:"order_violations"`
	StateMismatches int     `json:"state_mismatches"`
	PeakGoroutines  int     `json:"peak_goroutines"`
	PeakHeapBytes   uint64  `json:"peak_heap_bytes"`
	AllocsPerEvent  float64 `json:"allocs_per_event"`

	baseHeap uint64                  // live heap just before the run: the stream and the harness
	hist     *hdrhistogram.Histogram // all events' latencies, ns
	cold     *hdrhistogram.Histogram // events of keys other than the slow one, ns
	ordered  bool                    // the rival promises per-key order
}

// newHist makes a latency histogram in nanoseconds: 1 ns to 1 hour, three
// significant digits.
func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, int64(time.Hour), 3) }

// replay is the state of one rival's run: the handler model's state and
// what the handler measures.
type replay struct {
	w    *workload
	base time.Time // clock origin for lat

	// state[id] points at the NextBlob of the last event applied to key id
	// (nil: no event yet, the key is absent). One atomic word per key: safe
	// for any interleaving, serialising nothing, allocating nothing.
	state      []atomic.Pointer[string]
	violations atomic.Int64

	// lat[i] holds event i's publish time (ns since base) until its handler
	// ends, then its latency. The publisher writes it before Submit, the
	// handler after the rival handed it the event: ordered by the rival.
	lat []int64

	handled  atomic.Int64
	end      atomic.Int64 // ns since base when the last handler ended
	finished chan struct{}
}

func newReplay(w *workload) *replay {
	r := &replay{
		w:        w,
		base:     time.Now(),
		state:    make([]atomic.Pointer[string], len(w.keys)),
		lat:      make([]int64, len(w.events)),
		finished: make(chan struct{}),
	}
	if len(w.events) == 0 {
		close(r.finished)
	}
	return r
}

// mismatches counts the keys whose state differs from the sequential
// replay's final state (a key never applied counts too).
func (r *replay) mismatches() int {
	n := 0
	for id := range r.w.keys {
		if p := r.state[id].Load(); p == nil || *p != r.w.final[id] {
			n++
		}
	}
	return n
}

func (r *replay) now() int64 { return int64(time.Since(r.base)) }

// handle is the handler model for event i: check the key's state against the
// event's precondition (a violation if it does not hold), apply the event,
// then do the configured work.
func (r *replay) handle(i int) {
	w := r.w
	e := &w.events[i]
	id := w.ids[i]
	cur := r.state[id].Load()
	if cur == nil && !w.zero[i] || cur != nil && *cur != e.PrevBlob {
		r.violations.Add(1)
	}
	r.state[id].Store(&e.NextBlob)
	if d := w.workFor(id); d > 0 {
		switch w.work.kind {
		case workCPU:
			spin(d)
		case workIO:
			waitIO(d)
		}
	}
	end := r.now()
	r.lat[i] = end - r.lat[i]
	if r.handled.Add(1) == int64(len(w.events)) {
		r.end.Store(end)
		close(r.finished)
	}
}

// workFor is how long the handler works for an event of key id: the --work
// duration, times --slow-factor for the slow key, saturated (never wrapped
// negative, whatever the factor).
func (w *workload) workFor(id int32) time.Duration {
	d := w.work.dur
	if d <= 0 || w.work.kind == workNone {
		return 0
	}
	if id == w.slowID {
		d = durations.Scale(d, w.slowFactor)
	}
	return d
}

// dueAt is when event i is due, in ns from the run's start, in open loop
// (--rate): i intervals of 1/rate s, saturated (never negative).
func (w *workload) dueAt(i int) int64 {
	return int64(durations.Scale(durations.PerSecond(w.rate), float64(i)))
}

// spin keeps a CPU busy for d.
func spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// measure runs one rival over the workload and returns its row. onStart, if
// not nil, is called with the run's handled-events counter when publishing
// starts (for the progress bar). A rival that fails to build, refuses an
// event or reports an error from Close makes measure fail.
func measure(ctx context.Context, w *workload, info rivalInfo, cfg rivalConfig, onStart func(*atomic.Int64)) (result, error) {
	n := len(w.events)
	r := newReplay(w)
	rv, err := info.New(cfg)
	if err != nil {
		return result{}, fmt.Errorf("%s: %w", info.Name, err)
	}
	// The handlers are made before the clock starts, so that allocations
	// counted during the run are the rival's own.
	var submit func(i int) error
	if tr, ok := rv.(taskRival); ok {
		tasks := make([]func(context.Context) error, n)
		for i := range tasks {
			tasks[i] = func(context.Context) error { r.handle(i); return nil }
		}
		submit = func(i int) error { return tr.SubmitTask(ctx, w.events[i].Key, tasks[i]) }
	} else {
		fns := make([]func(), n)
		for i := range fns {
			fns[i] = func() { r.handle(i) }
		}
		submit = func(i int) error { return rv.Submit(ctx, w.events[i].Key, fns[i]) }
	}

	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	smp := startSampler(5 * time.Millisecond)
	if onStart != nil {
		onStart(&r.handled)
	}
	r.base = time.Now()
	var pubErr error
	for i := range n {
		if w.rate > 0 {
			// Open loop: event i is due at i*interval. Its latency counts
			// from then, so time spent blocked in an earlier Submit is not
			// hidden (no coordinated omission).
			due := w.dueAt(i)
			if d := due - r.now(); d > 0 {
				time.Sleep(time.Duration(d))
			}
			r.lat[i] = due
		} else {
			r.lat[i] = r.now()
		}
		if err := submit(i); err != nil {
			pubErr = fmt.Errorf("%s: submitting event %d (key %s): %w", info.Name, i, w.events[i].Key, err)
			break
		}
	}
	if pubErr == nil {
		select {
		case <-r.finished:
		case <-ctx.Done():
			pubErr = fmt.Errorf("%s: %w", info.Name, ctx.Err())
		}
	}
	peakG, peakHeap := smp.stop()
	runtime.ReadMemStats(&m1)
	if pubErr != nil {
		// Interrupted or refused: the rival's goroutines may still be busy
		// with accepted events; Close would wait for them.
		go rv.Close()
		return result{}, pubErr
	}
	if err := rv.Close(); err != nil {
		return result{}, fmt.Errorf("%s: close: %w", info.Name, err)
	}

	res := result{
		Scheduler:       info.Name,
		Events:          n,
		Keys:            len(w.keys),
		Seconds:         float64(r.end.Load()) / 1e9,
		OrderViolations: r.violations.Load(),
		PeakGoroutines:  peakG,
		PeakHeapBytes:   peakHeap,
		hist:            newHist(),
		ordered:         info.Ordered,
		baseHeap:        m0.HeapAlloc,
		Seed:            cfg.Seed,
	}
	if n > 0 {
		res.AllocsPerEvent = float64(m1.Mallocs-m0.Mallocs) / float64(n)
	}
	if res.Seconds > 0 {
		res.EventsPerSec = float64(n) / res.Seconds
	}
	res.StateMismatches = r.mismatches()
	cold := newHist()
	res.cold = cold
	for i, l := range r.lat {
		l = max(l, 1)
		_ = res.hist.RecordValue(l) // values above an hour saturate: fine
		if w.ids[i] != w.slowID {
			_ = cold.RecordValue(l)
		}
	}
	us := func(h *hdrhistogram.Histogram, p float64) float64 { return float64(h.ValueAtPercentile(p)) / 1e3 }
	res.P50us, res.P99us, res.P999us = us(res.hist, 50), us(res.hist, 99), us(res.hist, 99.9)
	res.ColdP99us = us(cold, 99)
	if w.neighbour != nil {
		nb := newHist()
		for i, l := range r.lat {
			if w.neighbour[w.ids[i]] {
				_ = nb.RecordValue(max(l, 1))
				res.NeighbourEvents++
			}
		}
		if res.NeighbourEvents > 0 {
			res.NeighbourP99us = us(nb, 99)
		}
	}
	return res, nil
}

// sampler records the peak goroutine count and live heap while a run goes on.
type sampler struct {
	stopc    chan struct{}
	wg       sync.WaitGroup
	samples  []metrics.Sample
	peakG    int
	peakHeap uint64
}

func startSampler(every time.Duration) *sampler {
	s := &sampler{
		stopc: make(chan struct{}),
		samples: []metrics.Sample{
			{Name: "/sched/goroutines:goroutines"},
			{Name: "/memory/classes/heap/objects:bytes"}, // = MemStats.HeapAlloc
		},
	}
	s.sample()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.stopc:
				return
			case <-t.C:
				s.sample()
			}
		}
	}()
	return s
}

func (s *sampler) sample() {
	metrics.Read(s.samples)
	if v := s.samples[0].Value; v.Kind() == metrics.KindUint64 {
		s.peakG = max(s.peakG, int(v.Uint64()))
	}
	if v := s.samples[1].Value; v.Kind() == metrics.KindUint64 {
		s.peakHeap = max(s.peakHeap, v.Uint64())
	}
}

// stop ends sampling, takes a last sample and returns the peaks.
func (s *sampler) stop() (goroutines int, heap uint64) {
	close(s.stopc)
	s.wg.Wait()
	s.sample()
	return s.peakG, s.peakHeap
}
