package keysched

import (
	"cmp"
	"context"
	"fmt"
	"reflect"
	"slices"
	"time"
	"unsafe"
)

// This file holds what operators look at: the observer hook for per-task
// timing, task ages (the oldest unfinished task, per key and in total) and
// the per-key inspection Keys. Nothing here adds work to the hot path unless
// an observer or WithTaskAges is set: then a task costs one monotonic clock
// read when it is accepted, and with an observer two per attempt, or one for
// an attempt that follows its key's previous task on the same worker (see
// Observer.AttemptStarted).

// A Mono is a reading of the monotonic clock, in nanoseconds from an origin
// fixed for the process (not a wall time, and not comparable across
// processes). Subtract two with Sub to get a duration. Inside a
// testing/synctest bubble it follows the bubble's fake clock.
type Mono int64

// monoBase is the origin of Mono readings. time.Since on a time with a
// monotonic reading reads only the monotonic clock (no wall time).
var monoBase = time.Now()

// MonoNow returns the monotonic clock's current reading.
func MonoNow() Mono { return Mono(time.Since(monoBase)) }

// Sub returns the duration m-o.
func (m Mono) Sub(o Mono) time.Duration { return time.Duration(m - o) }

// An Observer receives per-task timing events from a scheduler (see
// WithObserver): when a task was accepted, when each attempt started and
// ended, and when a task was dead-lettered, each with a Mono timestamp. Any
// field may be nil: that event is then not reported.
//
// The functions run on the hot path, synchronously, on the goroutine that
// made the event happen (Accepted on the submitter's, the attempt events on
// the worker's, DeadLettered on the worker's or Close's), with no scheduler
// lock held. They must be fast (recording into a histogram is the expected
// work), must not block, must not call runtime.Goexit, and should not panic:
// a panic is recovered, the event is lost, and the first such panic is logged
// (WithLogger). They may be called concurrently from many goroutines. They
// see a task's key as the K the scheduler has; do not turn keys into metric
// attributes (unbounded cardinality, often personal data): per-key detail is
// what Keys is for.
type Observer[K comparable] struct {
	// Accepted is called once per accepted task, after Submit or TrySubmit
	// linked it (before they return), with the time of acceptance. For a
	// task queued behind others of its key it may come after the task's
	// AttemptStarted (a worker may reach it first); order by the times.
	Accepted func(key K, at Mono)
	// AttemptStarted is called when an attempt of a task starts running on
	// a worker, just before the task function is called. Ended, Err and
	// Panicked are zero. For the first attempt, Started-Accepted is the
	// task's queue wait. When a worker goes straight on from a key's task
	// that succeeded to the key's next task, accepted before that task
	// ended, the next task's Started is the previous one's Ended (one clock
	// read instead of two; the hand-over between them, no user code and no
	// waiting, counts as queue wait). Always Accepted <= Started <= Ended,
	// and a task of a key starts no earlier than its predecessor ended.
	AttemptStarted func(key K, a AttemptInfo)
	// AttemptEnded is called when the task function has returned (or
	// panicked), before the scheduler decides what follows (success,
	// retry, dead letter, park). Ended-Started is the attempt's duration.
	// (A task that calls runtime.Goexit ends its attempt unreported; it is
	// counted as panicked, and dead-lettered, as ever.) A snoozed run (the
	// task returned a Snooze error) is reported like any attempt, with that
	// error as Err (IsSnoozed tells it apart); it is not counted, so the
	// run after it has the same N.
	AttemptEnded func(key K, a AttemptInfo)
	// DeadLettered is called once per dead letter (see WithDeadLetter),
	// before it is delivered, with its error (ErrAborted, or an error
	// matching it that says the task ran, for a task Close gave up on).
	DeadLettered func(key K, at Mono, err error)
}

// An AttemptInfo describes one attempt of a task, for an Observer.
type AttemptInfo struct {
	N        int   // which attempt of the task: 1 for the first (a resumed parked task's attempts go on counting; a snoozed run does not count)
	Accepted Mono  // when the task was accepted
	Started  Mono  // when this attempt started
	Ended    Mono  // when it returned (AttemptEnded only)
	Err      error // what it returned, or a *PanicError (AttemptEnded only)
	Panicked bool  // the attempt panicked (AttemptEnded only)
}

// WithObserver sets o's functions to be called on the events of every task
// (see Observer). It implies WithTaskAges. A nil function field skips that
// event; a scheduler without an observer pays nothing for the hook (one nil
// check per event). K must be the scheduler's key type, or New fails.
func WithObserver[K comparable](o Observer[K]) Option {
	return func(c *config) error {
		c.observer = &o
		c.taskAges = true
		return nil
	}
}

// WithTaskAges stamps every accepted task with the time of its acceptance
// (one monotonic clock read per task, some tens of nanoseconds, and 8 bytes),
// so that OldestAge, KeyAge and Keys can tell how long the oldest unfinished
// tasks have waited. Without it (or WithObserver) those ages are 0. With it,
// SubmitBatch and TrySubmitBatch accept their tasks one by one, as that many
// Submit or TrySubmit calls would (same contract, none of the batch's
// savings).
func WithTaskAges() Option {
	return func(c *config) error { c.taskAges = true; return nil }
}

// setObserver checks and installs the observer option (called by New).
func (s *Scheduler[K]) setObserver(o any) error {
	if o == nil {
		return nil
	}
	obs, ok := o.(*Observer[K])
	if !ok {
		return optionError("WithObserver", nil, "the Observer is a %s, the scheduler's keys are %s",
			reflect.TypeOf(o).Elem(), reflect.TypeFor[K]())
	}
	if obs.Accepted != nil || obs.AttemptStarted != nil || obs.AttemptEnded != nil || obs.DeadLettered != nil {
		s.obs = obs
	}
	return nil
}

// The hook calls below run only when s.obs != nil (the call sites check).
// Each recovers a panic in the user's function.

func (s *Scheduler[K]) hookAccepted(key K, at Mono) {
	if f := s.obs.Accepted; f != nil {
		defer s.hookRecover()
		f(key, at)
	}
}

// hookStarted reports the start of n's next attempt and returns its time:
// clk's reading when it can stand for it (see attempt), else the clock's.
func (s *Scheduler[K]) hookStarted(n *node[K], clk *handClock) Mono {
	var now Mono
	accepted := *s.stamp(n)
	if clk != nil && clk.ok && clk.at >= accepted && n.more.Load() == nil {
		now = clk.at
	} else {
		now = MonoNow()
	}
	if clk != nil {
		clk.ok = false
	}
	if f := s.obs.AttemptStarted; f != nil {
		defer s.hookRecover()
		f(n.key, AttemptInfo{N: n.attempts() + 1, Accepted: accepted, Started: now})
	}
	return now
}

// hookEnded reports the end of n's attempt. After a successful attempt it
// leaves its reading in clk for the key's next task on this runner.
func (s *Scheduler[K]) hookEnded(n *node[K], started Mono, err error, panicked bool, clk *handClock) {
	f := s.obs.AttemptEnded
	if f == nil && (clk == nil || err != nil) {
		return
	}
	now := MonoNow()
	if clk != nil && err == nil {
		clk.at, clk.ok = now, true
	}
	if f != nil {
		a := AttemptInfo{N: n.attempts(), Accepted: *s.stamp(n), Started: started,
			Ended: now, Err: err, Panicked: panicked}
		defer s.hookRecover()
		f(n.key, a)
	}
}

func (s *Scheduler[K]) hookDeadLettered(key K, err error) {
	if f := s.obs.DeadLettered; f != nil {
		defer s.hookRecover()
		f(key, MonoNow(), err)
	}
}

func (s *Scheduler[K]) hookRecover() {
	if r := recover(); r != nil {
		if s.obsPanics.Add(1) == 1 {
			func() {
				defer func() { _ = recover() }() // a logger that panics too
				s.cfg.logger.Error("keysched: an Observer function panicked (later panics are not logged)", "panic", r)
			}()
		}
	}
}

// KeyInfo describes one live key (one with queued or running tasks).
type KeyInfo[K comparable] struct {
	Key K
	// Depth is the key's queued plus running tasks (what WithMaxKeyDepth
	// bounds), a parked or retrying head included.
	Depth int
	// Parked reports whether the key is parked (FailurePolicy Park).
	Parked bool
	// HeadAge is how long ago the key's oldest unfinished task (its head)
	// was accepted; 0 without WithTaskAges or WithObserver.
	HeadAge time.Duration
}

// Keys returns up to n live keys, those with the most tasks first (ties: the
// older head first), each with its depth, whether it is parked and the age of
// its head. n <= 0 returns every live key.
//
// Cost: it walks every live key (O(keys · log n) time, O(n) memory), holding
// each of the tail map's buckets locked only while copying its few entries,
// so submitters and workers wait at most that long; call it for inspection
// (a debug endpoint, an alert's context), not per task. The figures are read
// key by key while tasks run: a snapshot of each key, not of the scheduler.
// A task withdrawn by Cancel while queued counts until its key reaches it.
func (s *Scheduler[K]) Keys(n int) []KeyInfo[K] {
	if s.zero() {
		return nil
	}
	var top []KeyInfo[K] // a min-heap on (Depth, HeadAge) when n > 0
	now := MonoNow()
	less := func(a, b KeyInfo[K]) bool {
		if a.Depth != b.Depth {
			return a.Depth < b.Depth
		}
		return a.HeadAge < b.HeadAge
	}
	s.tails.m.Range(func(key K, ch *chainHdr) bool {
		ki := s.keyInfo(key, ch, now)
		if ki.Depth == 0 {
			return true // drained and being removed
		}
		switch {
		case n <= 0 || len(top) < n:
			top = append(top, ki)
			if n > 0 {
				siftUp(top, len(top)-1, less)
			}
		case less(top[0], ki):
			top[0] = ki
			siftDown(top, 0, less)
		}
		return true
	})
	slices.SortFunc(top, func(a, b KeyInfo[K]) int {
		if a.Depth != b.Depth {
			return cmp.Compare(b.Depth, a.Depth)
		}
		return cmp.Compare(b.HeadAge, a.HeadAge)
	})
	return top
}

func (s *Scheduler[K]) keyInfo(key K, ch *chainHdr, now Mono) KeyInfo[K] {
	ki := KeyInfo[K]{Key: key, Depth: int(ch.depth.Load())}
	if h := ch.head.Load(); h != nil {
		ki.Parked = h.state.Load() == stParked
		ki.HeadAge = s.age(h, now)
	}
	return ki
}

// age is how long ago c was accepted (0 without stamps).
func (s *Scheduler[K]) age(c *Completion, now Mono) time.Duration {
	if !s.cfg.taskAges {
		return 0
	}
	return max(now.Sub(*s.stamp(nodeOf[K](c))), 0)
}

// A scheduler that stamps tasks (WithTaskAges, WithObserver) allocates each
// node with its acceptance time right behind it, so that a scheduler that
// does not pays nothing for the field (an int-keyed node is 80 bytes, a size
// class; one more field would make it 96).
type stampedNode[K comparable] struct {
	node[K]
	accepted Mono // written before the node is linked into its chain, never after
}

type stampedHeadNode[K comparable] struct {
	stampedNode[K]
	hdr chainHdr
}

// newStamped is submit's node allocation for a stamping scheduler (see
// headNode).
func (s *Scheduler[K]) newStamped(key K) (*node[K], *chainHdr) {
	if _, live := s.tails.load(key); live {
		n := &stampedNode[K]{}
		n.key = key
		return &n.node, nil
	}
	h := &stampedHeadNode[K]{}
	h.key = key
	return &h.node, &h.hdr
}

// submitEach is SubmitBatch for a scheduler that stamps its tasks: their
// nodes are stampedNodes, which the batch path's shared allocation is not,
// so it submits them one by one, with the batch's contract (a prefix is
// accepted, every refused item counts as rejected, the error names the
// first refused item).
func (s *Scheduler[K]) submitEach(ctx context.Context, items []BatchItem[K], wait bool) ([]*Completion, error) {
	done := make([]*Completion, 0, len(items))
	for i := range items {
		c, err := s.submit(ctx, items[i].Key, items[i].Task, wait)
		if err != nil {
			s.core.rejected.Add(uint64(len(items) - i - 1)) // submit counted item i
			return done, fmt.Errorf("keysched: batch: %d of %d tasks accepted, item %d refused: %w", i, len(items), i, err)
		}
		done = append(done, c)
	}
	return done, nil
}

// stamp returns where n's acceptance time is. Only for a stamping
// scheduler's nodes (cfg.taskAges), which are all stampedNodes: n is the
// first field of one.
func (s *Scheduler[K]) stamp(n *node[K]) *Mono {
	return &(*stampedNode[K])(unsafe.Pointer(n)).accepted
}

// KeyAge returns how long ago the key's oldest unfinished task (its head:
// running, queued, waiting out a retry backoff or parked) was accepted, or 0
// when the key has no task (or without WithTaskAges or WithObserver). It
// costs one map lookup.
func (s *Scheduler[K]) KeyAge(key K) time.Duration {
	if s.zero() || !s.cfg.taskAges || (s.keyCheck && !validKey(key)) {
		return 0
	}
	ch, ok := s.tails.load(key)
	if !ok {
		return 0
	}
	if h := ch.head.Load(); h != nil {
		return s.age(h, MonoNow())
	}
	return 0
}

// OldestAge returns how long ago the oldest unfinished task of the scheduler
// was accepted: the largest KeyAge over the live keys (running, queued,
// retrying and parked tasks all count). It is 0 when no task is unfinished,
// and without WithTaskAges or WithObserver.
//
// Cost: like Keys, it walks every live key's head (no per-task bookkeeping:
// the oldest task of a key is its head, since a key's tasks are accepted and
// finished in order), locking each bucket of the tail map only while copying
// its entries. Meant for a metrics collection every few seconds, not per
// task. A task withdrawn by Cancel while queued counts until its key reaches
// it.
func (s *Scheduler[K]) OldestAge() time.Duration {
	if s.zero() || !s.cfg.taskAges {
		return 0
	}
	now := MonoNow()
	var oldest time.Duration
	s.tails.m.Range(func(_ K, ch *chainHdr) bool {
		if h := ch.head.Load(); h != nil && ch.depth.Load() > 0 {
			oldest = max(oldest, s.age(h, now))
		}
		return true
	})
	return oldest
}

func siftUp[T any](h []T, i int, less func(a, b T) bool) {
	for i > 0 {
		p := (i - 1) / 2
		if !less(h[i], h[p]) {
			return
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func siftDown[T any](h []T, i int, less func(a, b T) bool) {
	for {
		l, m := 2*i+1, i
		if l < len(h) && less(h[l], h[m]) {
			m = l
		}
		if r := l + 1; r < len(h) && less(h[r], h[m]) {
			m = r
		}
		if m == i {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}
