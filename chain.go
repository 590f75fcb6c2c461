package keysched

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/keysched/keysched/internal/optcheck"
)

// A Task is the work for one event. Its context carries the values of the
// context given to Submit, but not its cancellation or deadline; it is
// cancelled by Completion.Cancel, when Close's context ends, when the attempt
// returns, and at WithTaskTimeout's deadline. A task may submit to the
// scheduler it runs on, its own key included: with the context it was given,
// such a submission never waits (it fails with ErrKeyFull or ErrFull instead).
type Task func(ctx context.Context) error

// A Scheduler runs tasks so that tasks with the same key run one at a time,
// in the order they were accepted, and tasks with different keys run
// concurrently on one bounded pool of workers.
//
// Precisely: for two tasks accepted for one key in that order, the first
// one's run (every attempt of it) happens before the second one's begins.
// Nothing is promised between keys. Every accepted task ends in exactly one
// terminal outcome (succeeded, failed, panicked, cancelled, aborted),
// observable through its Completion and counted in Stats.
//
// A task that is not at the head of its key costs memory only (about 100
// bytes): no goroutine, no worker, no timer. A blocked or slow key holds one
// worker and delays only its own later tasks.
//
// All methods are safe for concurrent use. The zero Scheduler is not usable:
// call New. On a nil or zero Scheduler, methods that return an error return
// ErrZeroScheduler, and the others zero values; none panics.
type Scheduler[K comparable] struct {
	core        core
	cfg         config
	maxKeyDepth int64
	keyCheck    bool // K can hold values that fail as map keys
	dlq         func(DeadLetter[K])

	tails   tailMap[K]
	pending pendingBound
	keyMu   sync.Mutex // guards chain.wake
	ready   readyQueue[K]
	workers *workers
	parked  parkedKeys[K]
	obs     *Observer[K] // nil: no hook (observe.go)

	obsPanics atomic.Uint64 // panics recovered from obs's functions

	letters letterQueue[K] // dead letters of aborted tasks (close.go)

	// passed is stored in a finished task's next once its key has moved on
	// past it: a walker that meets it knows to look at the head again.
	passed *node[K]

	closing   chan struct{} // closed when Close starts: wakes waiting submitters
	giveUp    chan struct{} // closed when a later Close's context ends: the first Close aborts
	giveUpOne sync.Once
	giveUpWhy error // the later Close's ctx error, set before giveUp is closed
	closeOnce sync.Once
	closed    chan struct{} // closed when the first Close returns
	closeErr  error
}

// node is one accepted task: a link of its key's chain and its Completion.
// Completion must stay the first field: nodeOf converts back. With an int key
// a node is 80 bytes, with a string key 88 (the 96-byte size class).
type node[K comparable] struct {
	Completion
	key       K
	next      atomic.Pointer[node[K]] // set inside the Compute that appends the successor
	readyNext *node[K]                // link in the ready queue, under its lock
}

// headNode is a node allocated together with its key's chain header, for a
// task that finds its key without a chain: a one-shot key then costs one
// allocation, not two. The header is used only if the key is still absent
// when the task is appended.
type headNode[K comparable] struct {
	node[K]
	hdr chainHdr
}

// nodeOf returns the node whose Completion c is (c is its first field).
func nodeOf[K comparable](c *Completion) *node[K] { return (*node[K])(unsafe.Pointer(c)) }

// chainHdr is the header shared by the tasks of one key while the key is
// live: from the task that finds the key absent to the one that removes it.
type chainHdr struct {
	core    *core
	head    atomic.Pointer[Completion] // the oldest unfinished task, or one just behind it
	depth   atomic.Int64               // queued + running tasks of the key
	waiters atomic.Int32               // submitters waiting for room on the key
	wake    chan struct{}              // closed to wake them; guarded by Scheduler.keyMu
	tail    *Completion                // the chain's last task; only inside a Compute on the key
}

// core is the part of a scheduler that Completions reach: counters, the abort
// flag and the registry of task contexts someone waits on.
type core struct {
	aborting atomic.Bool
	// The counters that every task touches are striped (counter, counter.go), so
	// that workers on different cores do not contend for one cache line.
	running      *counter
	submitted    *counter
	outcomes     [numOutcomes]*counter
	rejected     atomic.Uint64
	retried      atomic.Uint64
	snoozed      atomic.Uint64
	deadLettered atomic.Uint64
	// waiting counts the tasks waiting out a retry backoff or a Snooze (a
	// wait whose hand-back token is not yet taken: see backoff).
	waiting atomic.Int64
	notRun  atomic.Int64 // tasks aborted before they started (or resumed)
	// passing counts, once Close has given up, tasks whose pending slot is
	// released and whose Completion is about to be done (see pass).
	passing atomic.Int64
	// delivering counts dead letters taken and not yet delivered.
	delivering atomic.Int64

	watchMu sync.Mutex
	watched map[*lazyChan]struct{}

	// wakeStalled moves a key on after Cancel or Close's abort took its
	// waiting or parked head (it needs the key type, which core has not).
	wakeStalled func(c *Completion, from uint32)
}

// finish records c's outcome and releases everyone waiting on it (decide,
// then publish). The caller owns c: it moved c to stFinishing, or it is the
// runner of c.
func (k *core) finish(c *Completion, outcome int, err error) {
	k.decide(c, outcome, err)
	k.publish(c)
}

// decide writes and counts c's outcome and moves c to stDecided: its key may
// move past it. The outcome is counted before anyone can see c done, so that
// Stats read after a Completion is done counts it.
//
// It lets go of the task function: whoever decides a task has already made
// its dead letter if it needed one, and nobody reads it afterwards.
func (k *core) decide(c *Completion, outcome int, err error) {
	if err != nil {
		c.extra().err = err
	}
	c.task = nil
	k.outcomes[outcome].Inc()
	c.state.Store(stDecided)
}

// publish makes c, decided, done: Done is closed and Wait returns. If a dead
// letter of c is still being delivered, it leaves that to the delivery's end
// (endLetter): a Completion is done only once its dead letters were
// delivered, on every path. Publishing twice is harmless.
func (k *core) publish(c *Completion) {
	if c.ctxBits.Load()&dlCount != 0 {
		// The Or and endLetter's Add are ordered on one word: either this
		// sees the count at zero, or endLetter sees the request.
		if c.ctxBits.Or(ctxPubReq)&dlCount != 0 {
			return
		}
	}
	c.state.Store(stDone)
	if g := c.sig.Load(); g != nil { // else Done, when called, sees stDone
		g.done.close()
	}
}

// holdPassage makes c, which Close's abort takes while it is still on its
// key's chain, wait to be done until its key has passed it (passedOn), as
// well as for its dead letter: once its Completion is done, Stats no longer
// counts it or, if it was the last, its key.
func (k *core) holdPassage(c *Completion) { c.ctxBits.Add(dlUnit | ctxPassHold) }

// passedOn is called by the runner that passed c, decided and not yet done:
// it drops c's passage hold, if it has one, else publishes c.
func (k *core) passedOn(c *Completion) {
	if c.ctxBits.Load()&ctxPassHold == 0 {
		k.publish(c)
		return
	}
	c.ctxBits.And(^ctxPassHold) // only the runner that passed c clears it
	k.endLetter(c)
}

// endLetter records that a dead letter of c (counted by Scheduler.letter) was
// delivered, and publishes c if it was decided meanwhile.
func (k *core) endLetter(c *Completion) {
	if b := c.ctxBits.Add(^(dlUnit - 1)); b&dlCount == 0 && b&ctxPubReq != 0 {
		k.publish(c)
	}
}

// watch registers an attempt context's Done channel, so that Close's abort
// can close it. The flags word makes a handshake with endAttempt: the attempt
// is registered only if it has not ended, and endAttempt unregisters it if it
// was registered.
func (k *core) watch(bits *atomic.Uint32, done *lazyChan) {
	k.watchMu.Lock()
	if bits.Or(ctxWatched)&ctxEnded == 0 {
		k.watched[done] = struct{}{}
	}
	k.watchMu.Unlock()
}

func (k *core) unwatch(done *lazyChan) {
	k.watchMu.Lock()
	delete(k.watched, done)
	k.watchMu.Unlock()
}

// cancelWatched closes the Done channel of every running attempt someone
// waits on. (Their Err already reports the abort: see ctxErr.)
func (k *core) cancelWatched() {
	k.watchMu.Lock()
	for done := range k.watched {
		done.close()
	}
	k.watchMu.Unlock()
}

// New returns a scheduler for keys of type K, configured by opts.
// It fails with an *OptionError (errors.Is(err, ErrInvalidOption) holds)
// for a bad option or two that cannot both hold; see Option for how options
// meet. The scheduler starts its own ants pool of
// DefaultWorkers workers unless WithWorkers or WithPool says otherwise; call
// Close to release it.
func New[K comparable](opts ...Option) (*Scheduler[K], error) {
	cfg := defaultConfig()
	for i, o := range opts {
		if o == nil {
			return nil, refused(optcheck.NilOption(i, "Option"))
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	s := &Scheduler[K]{
		cfg:         cfg,
		maxKeyDepth: int64(cfg.maxKeyDepth),
		keyCheck:    keyNeedsCheck(reflect.TypeFor[K]()),
		tails:       newTailMap[K](),
		passed:      new(node[K]),
		closing:     make(chan struct{}),
		giveUp:      make(chan struct{}),
		closed:      make(chan struct{}),
	}
	if cfg.deadLetter != nil {
		fn, ok := cfg.deadLetter.(func(DeadLetter[K]))
		if !ok {
			return nil, optionError("WithDeadLetter", nil, "the function takes %s, the scheduler's keys are %s",
				reflect.TypeOf(cfg.deadLetter).In(0), reflect.TypeFor[K]())
		}
		s.dlq = fn
	}
	if err := s.setObserver(cfg.observer); err != nil {
		return nil, err
	}
	s.pending.max = int64(cfg.maxPending)
	s.parked.m = make(map[K]*node[K])
	s.core.watched = make(map[*lazyChan]struct{})
	s.core.running, s.core.submitted = newCounter(), newCounter()
	for i := range s.core.outcomes {
		s.core.outcomes[i] = newCounter()
	}
	s.pending.freed = newCounter()
	s.core.wakeStalled = s.wakeStalled
	w, err := newWorkers(&s.cfg, s.runLoop, s.ready.nonEmpty)
	if err != nil {
		return nil, err
	}
	s.workers = w
	return s, nil
}

// Submit accepts task for key, waiting while the key is at its depth bound
// (WithMaxKeyDepth) or the scheduler at its pending bound (WithMaxPending),
// until there is room or ctx ends. It returns the task's Completion.
//
// ctx bounds admission only: when it ends first, Submit returns an error that
// wraps ctx's error (and ErrKeyFull or ErrFull), and nothing was enqueued. The
// task's own context keeps ctx's values but not its cancellation.
//
// With the context a task received (or one derived from it), Submit never
// waits: it returns ErrKeyFull or ErrFull at once when there is no room, since
// waiting on the scheduler the task runs on can deadlock.
//
// Other errors: ErrNilTask, ErrInvalidKey, ErrNilContext, ErrClosed (once
// Close has started), ErrZeroScheduler (s not made by New), or ctx's error
// when it had ended already.
func (s *Scheduler[K]) Submit(ctx context.Context, key K, task Task) (*Completion, error) {
	return s.submit(ctx, key, task, true)
}

// TrySubmit is Submit without waiting: it fails at once with ErrKeyFull,
// ErrFull or ErrClosed when the task cannot be accepted now.
func (s *Scheduler[K]) TrySubmit(ctx context.Context, key K, task Task) (*Completion, error) {
	return s.submit(ctx, key, task, false)
}

// submit is the hot path's first half (run.go's runLoop is the second).
//
// Atomic read-modify-writes per task, for a task appended to a live key and
// run by a runner already on that key (the deep-chain case), counted on the
// code as it is (keep this count true when changing the path):
//
//	submit:  pending.taken CAS, submitted Add, the bucket lock's CAS and its
//	         unlock, depth Add                                          5
//	run:     state CAS (queued -> running), ctxBits Or (started),
//	         running Add +1 and -1, ctxBits Or (ended), outcome Add,
//	         depth Add, freed Add                                       8
//
// 13 in all, plus four sequentially consistent stores (the predecessor's
// next, state = done, the header's head, next = passed), which are an XCHG
// each on amd64. A task that starts its key adds a ready-queue push and pop
// (a mutex each, and the queue's length Add) and a runner-slot CAS. The
// counters (counter.go) are striped: their Adds rarely contend.
func (s *Scheduler[K]) submit(ctx context.Context, key K, task Task, wait bool) (*Completion, error) {
	if err := s.check(ctx, key, task); err != nil {
		if errors.Is(err, ErrZeroScheduler) {
			return nil, err
		}
		s.core.rejected.Add(1)
		return nil, err
	}
	if wait && inTask(ctx) {
		wait = false
	}
	// A lock-free look first: a key without a chain gets its header in the
	// same allocation as its task.
	var n *node[K]
	var spare *chainHdr
	if s.cfg.taskAges {
		n, spare = s.newStamped(key) // a node with room for its time (observe.go)
	} else if _, live := s.tails.load(key); live {
		n = &node[K]{key: key}
	} else {
		h := &headNode[K]{}
		h.key = key
		n, spare = &h.node, &h.hdr
	}
	n.task, n.parent = task, withValues(ctx)
	for {
		if err := s.pending.acquire(ctx, wait, s.closing); err != nil {
			s.core.rejected.Add(1)
			return nil, err
		}
		s.core.submitted.Inc()
		if s.cfg.taskAges {
			*s.stamp(n) = MonoNow() // before append publishes n
		}
		head, full := s.tails.append(n, s.maxKeyDepth, &s.core, spare)
		if full == nil {
			if s.obs != nil {
				s.hookAccepted(key, *s.stamp(n))
			}
			if s.core.aborting.Load() {
				// Close's abort may have walked this key before n was linked;
				// either it saw n, or n sees the flag here.
				s.abortNode(n)
			}
			if head {
				s.ready.push(n)
				s.workers.kick()
			}
			return &n.Completion, nil
		}
		s.core.submitted.Dec()
		s.pending.release()
		if !wait {
			s.core.rejected.Add(1)
			return nil, ErrKeyFull
		}
		if err := s.waitKey(ctx, full); err != nil {
			s.core.rejected.Add(1)
			return nil, err
		}
	}
}

// zero reports a nil or zero-value Scheduler (not made by New).
func (s *Scheduler[K]) zero() bool { return s == nil || s.tails.m == nil }

func (s *Scheduler[K]) check(ctx context.Context, key K, task Task) error {
	if s.zero() {
		return ErrZeroScheduler
	}
	if ctx == nil {
		return ErrNilContext
	}
	if task == nil {
		return ErrNilTask
	}
	if s.keyCheck && !validKey(key) {
		return invalidKey(key)
	}
	return ctx.Err()
}
