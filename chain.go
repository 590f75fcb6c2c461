package keysched

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
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
			return nil, optionError(fmt.Sprintf("opts[%d]", i), nil, "nil Option")
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

// KeyDepth returns the key's queued plus running tasks: the quantity
// WithMaxKeyDepth bounds. It is 0 for a key with none (and for an invalid
// key). A cancelled task still counts until its key's chain reaches it.
func (s *Scheduler[K]) KeyDepth(key K) int {
	if s.zero() || s.keyCheck && !validKey(key) {
		return 0
	}
	ch, ok := s.tails.load(key)
	if !ok {
		return 0
	}
	return int(ch.depth.Load())
}

// Drain waits until every task accepted so far has finished, or ctx ends.
// With submitters still at work it may also wait for tasks accepted while it
// waits: it returns when none is pending. Parked keys (FailurePolicy Park)
// hold unfinished tasks: Drain waits for them to be resumed or skipped.
// When ctx ends first it returns an error wrapping ctx's error that says how
// many tasks are unfinished, how many keys are parked and how many tasks are
// waiting to run again (a retry backoff, or a Snooze: a task that snoozes for
// ever holds its key for ever, and Drain waits for it). With a task's context
// it returns ErrInsideTask.
func (s *Scheduler[K]) Drain(ctx context.Context) error {
	if s.zero() {
		return ErrZeroScheduler
	}
	if ctx == nil {
		return ErrNilContext
	}
	if inTask(ctx) {
		return ErrInsideTask
	}
	if err := s.pending.waitIdle(ctx, nil); err != nil {
		return fmt.Errorf("keysched: drain: %d tasks unfinished, %d keys parked, %d tasks waiting to run again (retry backoff or Snooze): %w",
			s.pending.count(), s.parkedCount(), s.core.waiting.Load(), err)
	}
	s.awaitPassing()
	return nil
}

// awaitPassing waits for the Completions that runners are about to make done
// after releasing their pending slots (only once Close has given up: see
// pass). Those runners run no user code in that window.
func (s *Scheduler[K]) awaitPassing() {
	for s.core.passing.Load() != 0 {
		runtime.Gosched()
	}
}

// Close shuts the scheduler down. From the moment it starts, Submit and
// TrySubmit fail with ErrClosed (decided atomically with the enqueue: a task
// is either accepted, and then run or aborted, or refused) and waiting
// submitters are woken with it. Accepted tasks finish (a parked key counts
// as unfinished until Resume or Skip); then Close releases the scheduler's
// own pool (not one given with WithPool) and returns nil.
//
// If ctx ends first, Close gives up: it cancels the contexts of running
// tasks, completes every task that has not started (including retries
// waiting out a backoff and parked keys) with ErrAborted and hands those to
// the dead-letter function, and returns a *CloseError (wrapping ErrAborted
// and ctx's error) that says how many did not run. It returns within
// CloseGrace (100 ms) of giving up, however long the backlog: the aborted
// tasks' dead letters are delivered concurrently across keys (on up to one
// goroutine per worker, at most 64) and one at a time per key, in the key's
// order: an aborted task's letter is delivered once its key has passed it,
// so the letters of the tasks queued behind a task still running (which
// hold their slots anyway) come after that task returns and after its own
// dead letter, if it has one. What is not finished
// by then (dead letters still being delivered, tasks still running, a
// backlog not yet walked) is counted in the *CloseError and goes on in the
// background; nothing is dropped. Drain after such a Close waits for that
// background work (a process about to exit should call it, with a deadline
// of its own, or the letters still being delivered are lost with the
// process). A task that ignores its context keeps its worker until it
// returns.
//
// Close is idempotent: later calls wait for the first to finish and return
// its result; if a later call's ctx ends first, the first Close gives up as
// if its own had ended (so a Close(context.Background()) waiting on a parked
// key can be escalated). With a task's context it returns ErrInsideTask and
// does nothing.
//
// When it returns with an error, tasks still running (and the aborted tasks
// queued behind them) and dead letters still being delivered hold their
// slots in Stats until they are done; each such task's Completion is done
// once its key no longer counts it and its dead letter was delivered, so
// once every Completion is done Stats is settled.
func (s *Scheduler[K]) Close(ctx context.Context) error {
	if s.zero() {
		return ErrZeroScheduler
	}
	if ctx == nil {
		return ErrNilContext
	}
	if inTask(ctx) {
		return ErrInsideTask
	}
	first := false
	s.closeOnce.Do(func() { first = true })
	if !first {
		select {
		case <-s.closed:
			return s.closeErr
		case <-ctx.Done():
			// Escalate: the first Close gives up now too.
			s.giveUpOne.Do(func() { close(s.giveUp) })
			<-s.closed
			return s.closeErr
		}
	}
	s.pending.close()
	close(s.closing)
	var err error
	if werr := s.pending.waitIdle(ctx, s.giveUp); werr != nil {
		err = s.giveUpOnTasks(werr) // close.go
		s.workers.releaseNow()
	} else {
		// Every task and dead letter is done: only idle workers are left to
		// exit. A later Close giving up need not wait for them either.
		rctx, cancel := context.WithCancel(ctx)
		giveUp := s.giveUp // not s: this goroutine may outlive Close by a moment
		go func() {
			select {
			case <-giveUp:
				cancel()
			case <-rctx.Done():
			}
		}()
		if rerr := s.workers.release(rctx); rerr != nil {
			err = fmt.Errorf("keysched: close: releasing the pool: %w", rerr)
		}
		cancel()
	}
	s.closeErr = err
	close(s.closed)
	return err
}

// abort gives up on every task that has not started: Close's context ended.
// (Each task it completes with ErrAborted is counted in core.notRun.) The
// caller has set core.aborting and cancelled the running tasks' contexts.
func (s *Scheduler[K]) abort() {
	s.tails.m.Range(func(_ K, ch *chainHdr) bool {
		s.abortChain(ch)
		return true
	})
}

// settle moves keys past the tasks abort finished, so that Stats and
// KeyDepth count only what is still held by running tasks (and queued behind
// them), and so that their dead letters go to their keys' lanes (passing a
// key hands them over, in its order). It takes what is in the ready queue
// itself (step runs no task while the scheduler aborts: it finishes them),
// while the walk (abort) goes on, until walked is closed; then it waits for
// runners that are moving keys on and for dead letters being delivered,
// until stop is closed. Once stop is closed it still waits for the walk and
// passes what the walk left in the ready queue, so that no key is left
// unpassed (Close has returned by then).
func (s *Scheduler[K]) settle(stop, walked <-chan struct{}) {
	for i := 0; ; i++ {
		walkDone := isClosed(walked) // before passReady: it passes all the walk left
		s.passReady()
		if walkDone && s.core.delivering.Load() == 0 && s.core.passing.Load() == 0 && s.pending.count() <= s.heldByRunning() {
			return
		}
		if isClosed(stop) {
			<-walked
			s.passReady()
			return
		}
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// passReady takes the keys in the ready queue and passes their finished
// tasks (see settle).
func (s *Scheduler[K]) passReady() {
	for n := s.ready.pop(); n != nil; n = s.ready.pop() {
		for n != nil && s.step(n, nil) {
			n = s.pass(n)
		}
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// heldByRunning counts the tasks of keys whose head's task function is still
// running: what Close cannot settle while it waits for no one. (A head whose
// attempt has returned is being finished by its worker: that settles.)
func (s *Scheduler[K]) heldByRunning() int64 {
	var held int64
	s.tails.m.Range(func(_ K, ch *chainHdr) bool {
		if h := ch.head.Load(); h != nil && h.state.Load() == stRunning && !attemptEnded(h) {
			held += ch.depth.Load()
		}
		return true
	})
	return held
}

// abortChain aborts the unstarted tasks of one chain, from its head on. The
// head pointer may lag behind a runner that is moving the key on; a node the
// key has moved past has the passed sentinel as its next, and the head has
// been moved beyond it before: so from there, go on at the head. A node whose
// next is nil is the tail: stop.
func (s *Scheduler[K]) abortChain(ch *chainHdr) {
	var n *node[K]
	if h := ch.head.Load(); h != nil {
		n = nodeOf[K](h)
	}
	for n != nil {
		s.takeAborted(n)
		next := n.next.Load()
		if next == s.passed {
			next = nil
			if h := ch.head.Load(); h != &n.Completion { // else the key drained at n
				next = nodeOf[K](h)
			}
		}
		n = next
	}
}

// abortNode completes n with ErrAborted if it has not started; its dead
// letter is delivered once its key passes it (see takeAborted).
func (s *Scheduler[K]) abortNode(n *node[K]) { s.takeAborted(n) }

// takeAborted completes n with ErrAborted if it has not started, and keeps
// its dead letter on n: n is still on its key's chain, and whoever passes it
// there (its key's runner, or Close's settle) hands the letter to the key's
// lane (laneAborted), so that the key's dead letters are delivered in its order,
// after those of the tasks before n (n's own pending slot counts it until
// then). n is done once its letter was delivered.
func (s *Scheduler[K]) takeAborted(n *node[K]) bool {
	c := &n.Completion
	for {
		switch st := c.state.Load(); st {
		case stQueued, stWaiting, stParked:
			if !c.state.CompareAndSwap(st, stFinishing) {
				continue
			}
			// No user code between taking it and deciding it (see step).
			s.keepAborted(n, st == stParked)
			s.core.notRun.Add(1)
			if st != stQueued {
				s.wakeStalled(c, st)
			}
			s.core.publish(c)
			return true
		default:
			return false
		}
	}
}

// Stats is a snapshot of a scheduler's state and counters. The fields are
// read one by one while tasks run, so they agree with each other only when
// the scheduler is idle: after Drain or Close returns,
// Submitted == Succeeded + Failed + Panicked + Cancelled + Aborted,
// Pending == 0 and Keys == 0. A task's outcome is counted before its
// Completion is done. When Close gave up and returned while tasks still ran,
// each of them (and the aborted tasks queued behind it on its key) stops
// counting in Pending and Keys before its Completion is done: once every
// Completion is done, Stats is settled.
type Stats struct {
	Keys    int // keys with queued or running tasks now
	Pending int // accepted tasks not yet finished (and not yet passed by their key), plus dead letters being delivered
	Running int // tasks running now
	// ParkedKeys is the number of keys parked now (FailurePolicy Park).
	ParkedKeys int

	Submitted uint64 // tasks accepted since New
	Succeeded uint64 // tasks that returned nil
	Failed    uint64 // tasks that failed for good (dead-lettered, or skipped)
	Panicked  uint64 // tasks whose last attempt panicked
	Cancelled uint64 // tasks withdrawn by Completion.Cancel
	// Aborted counts tasks Close gave up on: queued, waiting out a retry
	// backoff or a Snooze, or parked (outcome ErrAborted, never run again), and running
	// tasks whose attempt failed after Close cancelled their context (their
	// own error, dead-lettered like any failure). A running task that
	// returns nil counts in Succeeded.
	Aborted uint64

	Rejected uint64 // tasks refused: Submit and TrySubmit calls that returned an error, and the tasks of a batch not accepted
	// Retried counts retries scheduled (attempts after the first).
	Retried uint64
	// Snoozed counts runs that returned a Snooze error and were scheduled
	// to run again without spending an attempt (not counted in Retried).
	Snoozed uint64
	// DeadLettered counts deliveries to the dead letter (or the log).
	DeadLettered uint64
}

// Stats returns a snapshot of the scheduler's state and counters.
func (s *Scheduler[K]) Stats() Stats {
	if s.zero() {
		return Stats{}
	}
	k := &s.core
	return Stats{
		Keys:         s.tails.m.Size(),
		Pending:      int(s.pending.count()),
		Running:      int(k.running.Value()),
		ParkedKeys:   s.parkedCount(),
		Submitted:    uint64(k.submitted.Value()),
		Succeeded:    uint64(k.outcomes[outSucceeded].Value()),
		Failed:       uint64(k.outcomes[outFailed].Value()),
		Panicked:     uint64(k.outcomes[outPanicked].Value()),
		Cancelled:    uint64(k.outcomes[outCancelled].Value()),
		Aborted:      uint64(k.outcomes[outAborted].Value()),
		Rejected:     k.rejected.Load(),
		Retried:      k.retried.Load(),
		Snoozed:      k.snoozed.Load(),
		DeadLettered: k.deadLettered.Load(),
	}
}
