package bus

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keysched/keysched"
)

// A Handler handles one event of type E. It runs on a worker of the bus's
// pool; events of one key reach it one at a time, in publication order. ctx
// is the attempt's context (see the package doc): it carries the values of
// Publish's context, ends when the attempt returns or at Timeout's deadline,
// and makes a Publish made with it fail fast instead of waiting. env is the
// event's envelope and event is env.Event as an E.
//
// A nil error acknowledges the event. An error is retried with Retry, and
// dead-lettered once it fails for good; wrap it with keysched.Permanent to
// dead-letter it at once. A panic is recovered and dead-lettered as a
// *keysched.PanicError.
type Handler[K comparable, E any] func(ctx context.Context, env Envelope[K], event E) error

// OverflowPolicy says what Publish does with a subscriber that is at one of
// its bounds (MaxKeyDepth for the event's key, or MaxPending).
type OverflowPolicy int

const (
	// Block waits for room, until Publish's context ends (then the
	// subscriber refuses with an error wrapping the bound's and the
	// context's errors). The default. A handler's own Publish never waits.
	Block OverflowPolicy = iota
	// Reject refuses the event for this subscriber only: Publish's
	// *PublishError names it with keysched.ErrKeyFull or keysched.ErrFull.
	Reject
	// DropNewest drops the event for this subscriber only, counts it in
	// SubStats.Dropped, and names it in Publish's *PublishError with an
	// error wrapping ErrDropped and the bound's error.
	DropNewest
)

func (p OverflowPolicy) String() string {
	switch p {
	case Block:
		return "Block"
	case Reject:
		return "Reject"
	case DropNewest:
		return "DropNewest"
	}
	return fmt.Sprintf("OverflowPolicy(%d)", int(p))
}

// A SubOption configures Subscribe. A bad or contradictory option makes
// Subscribe return an error wrapping keysched.ErrInvalidOption.
type SubOption func(*subConfig) error

type subConfig struct {
	maxConcurrency int
	maxKeyDepth    int
	maxPending     int
	overflow       OverflowPolicy
	retry          *keysched.RetryPolicy
	failure        keysched.FailurePolicy
	timeout        time.Duration
	ejectAfter     int
	deadLetter     any // func(DeadLetter[K]) for the bus's K
}

// MaxConcurrency is the subscriber's bulkhead: at most n of its handlers run
// at once, so a slow subscriber cannot take more than n of the bus's workers
// (default: the pool's size). n >= 1.
func MaxConcurrency(n int) SubOption {
	return func(c *subConfig) error {
		if n < 1 {
			return optionError("MaxConcurrency(%d): need at least 1", n)
		}
		c.maxConcurrency = n
		return nil
	}
}

// MaxKeyDepth bounds, per key, the events this subscriber holds, queued plus
// running (default keysched.DefaultMaxKeyDepth). At the bound its
// OverflowPolicy applies. n >= 1.
func MaxKeyDepth(n int) SubOption {
	return func(c *subConfig) error {
		if n < 1 {
			return optionError("MaxKeyDepth(%d): need at least 1", n)
		}
		c.maxKeyDepth = n
		return nil
	}
}

// MaxPending bounds the events this subscriber holds over all keys, queued
// plus running (default keysched.DefaultMaxPending, about 10 MiB of queued
// events): the subscriber's memory bound. At the bound its OverflowPolicy
// applies. n >= 1.
func MaxPending(n int) SubOption {
	return func(c *subConfig) error {
		if n < 1 {
			return optionError("MaxPending(%d): need at least 1", n)
		}
		c.maxPending = n
		return nil
	}
}

// OnFull sets what Publish does when this subscriber is at a bound (default
// Block). See OverflowPolicy.
func OnFull(p OverflowPolicy) SubOption {
	return func(c *subConfig) error {
		if p != Block && p != Reject && p != DropNewest {
			return optionError("OnFull(%d): unknown policy", int(p))
		}
		c.overflow = p
		return nil
	}
}

// Retry makes this subscriber's delivery at-least-once: a failed attempt is
// retried as keysched.RetryPolicy says, then dead-lettered. The handler must
// be idempotent (see Dedup). While an event waits out a backoff, its key's
// later events wait for this subscriber (order holds), holding no worker.
func Retry(p keysched.RetryPolicy) SubOption {
	return func(c *subConfig) error {
		c.retry = &p // validated by keysched.WithRetry when Subscribe runs
		return nil
	}
}

// Failure sets what a key does, for this subscriber, after one of its events
// failed for good (default keysched.Continue: dead-letter it and go on).
// With keysched.Park the key stops for this subscriber until
// Subscription.Resume or Subscription.Skip; its later events queue behind
// (within MaxKeyDepth), and Drain, Unsubscribe and Close wait for it.
func Failure(p keysched.FailurePolicy) SubOption {
	return func(c *subConfig) error {
		if p != keysched.Continue && p != keysched.Park {
			return optionError("Failure(%d): unknown policy", int(p))
		}
		c.failure = p
		return nil
	}
}

// Timeout gives each handler attempt a deadline d after it starts: its ctx
// then ends with context.DeadlineExceeded. An attempt that returns an error
// after its deadline counts as failed (and retryable). A handler that
// ignores its ctx cannot be stopped: it keeps its worker and its key until
// it returns. d > 0.
func Timeout(d time.Duration) SubOption {
	return func(c *subConfig) error {
		if d <= 0 {
			return optionError("Timeout(%v): need > 0", d)
		}
		c.timeout = d
		return nil
	}
}

// EjectAfter ejects the subscriber after n consecutive timed-out attempts.
// An attempt timed out when its ctx's deadline (Timeout) had passed by the
// time it returned, or when its error wraps context.DeadlineExceeded; any
// other attempt resets the count. Once ejected, the subscriber receives
// nothing new (Publish skips it and counts SubStats.Skipped), every event
// still queued for it is dead-lettered with ErrEjected without running the
// handler (as its key's chain reaches it: an event waiting out a retry
// backoff is dead-lettered when the backoff ends), the bus logs the ejection
// with log/slog, and the other subscribers carry on. With Failure(Park) its
// parked keys are skipped so their events are dead-lettered too. Ejection is
// final: Unsubscribe and subscribe again to recover. Requires Timeout.
// n >= 1.
func EjectAfter(n int) SubOption {
	return func(c *subConfig) error {
		if n < 1 {
			return optionError("EjectAfter(%d): need at least 1", n)
		}
		c.ejectAfter = n
		return nil
	}
}

// DeadLetters sets the function that receives each event this subscriber
// failed for good: its attempts ran out, its error was Permanent, it
// panicked, the subscriber was ejected (ErrEjected), or Close's context ended
// before it ran (keysched.ErrAborted). fn runs on a worker with no bus lock
// held (or in Close, for aborted events), once per such event; it should be
// quick, as the key waits for it. It may publish, but with Block it should
// use a context with a deadline, since it holds a worker. A panic in fn is
// recovered and logged. Without DeadLetters each such event is logged. K
// must be the bus's key type, or Subscribe fails.
func DeadLetters[K comparable](fn func(DeadLetter[K])) SubOption {
	return func(c *subConfig) error {
		if fn == nil {
			return optionError("DeadLetters(nil)")
		}
		c.deadLetter = fn
		return nil
	}
}

// A DeadLetter describes an event that a subscriber failed for good. It
// carries the original envelope (payload, ID, headers) for a deliberate
// replay with PublishEnvelope.
type DeadLetter[K comparable] struct {
	Subscriber string
	Envelope   Envelope[K]
	// Attempts is how many times the handler ran for the event (since the
	// last Resume, for a parked key); 0 for an event that never ran (Close
	// aborted it, or the subscriber was ejected first).
	Attempts int
	// Err is the last attempt's error, or the reason the event never ran:
	// ErrEjected, keysched.ErrAborted. A panic is a *keysched.PanicError.
	Err error
	// FirstAttempt and LastAttempt are when the first and the last failed
	// attempts ended; zero when the handler never ran for the event, and for
	// an ejected event (whose earlier attempts, if any, are not timed).
	FirstAttempt, LastAttempt time.Time
}

// SubStats is a snapshot of a subscriber's counters: its scheduler's
// keysched.Stats, adjusted, plus the bus's own. Fields are read one by one
// while events run, so they agree only when the bus is idle.
//
// In the embedded Stats: Submitted counts accepted events; events
// dead-lettered with ErrEjected count as Failed and DeadLettered (not as
// Succeeded); Rejected counts the events this subscriber refused in Publish
// (Dropped excluded).
type SubStats struct {
	keysched.Stats
	// Delivered counts events whose handler returned nil.
	Delivered uint64
	// Dropped counts events dropped by OnFull(DropNewest).
	Dropped uint64
	// Skipped counts events not offered because the subscriber was ejected.
	Skipped uint64
	// Ejected reports whether EjectAfter ejected the subscriber.
	Ejected bool
	// EjectedEvents counts events dead-lettered with ErrEjected without the
	// handler running.
	EjectedEvents uint64
}

// A Subscription is a subscriber registered on a bus: a name, a handler and
// its own scheduler (its own order, bounds and counters) on the bus's pool.
// Its key type K is the bus's, so Parked, Resume and Skip are checked by the
// compiler. All methods are safe for concurrent use.
type Subscription[K comparable] struct {
	s *sub[K]
}

// Name returns the subscriber's name, unique on its bus.
func (s *Subscription[K]) Name() string { return s.s.name }

// Unsubscribe removes the subscriber: from the moment it starts, Publish no
// longer offers it events (an event being offered concurrently may or may
// not be accepted). Then it waits until the events it accepted are handled
// and closes its scheduler. If ctx ends first, the running handlers' contexts
// are cancelled and the events that did not run are dead-lettered with
// keysched.ErrAborted; it returns an error wrapping keysched.ErrAborted and
// ctx's error. Idempotent: later calls wait for the first one's result. With
// a handler's context it returns keysched.ErrInsideTask and does nothing.
func (s *Subscription[K]) Unsubscribe(ctx context.Context) error { return s.s.unsubscribe(ctx) }

// Drain waits until every event this subscriber accepted so far has been
// handled or dead-lettered, or until ctx ends (then the error wraps ctx's).
// Parked keys hold their events. With a handler's context it returns
// keysched.ErrInsideTask.
func (s *Subscription[K]) Drain(ctx context.Context) error { return s.s.drain(ctx) }

// Stats returns a snapshot of the subscriber's counters.
func (s *Subscription[K]) Stats() SubStats { return s.s.stats() }

// Parked returns the keys now parked for this subscriber (Failure(Park)), in
// no order.
func (s *Subscription[K]) Parked() []K { return s.s.sched.Parked() }

// Resume runs a parked key's head event again for this subscriber, with a
// fresh attempt budget; if it then succeeds the key goes on. It returns
// keysched.ErrNotParked for a key that is not parked, keysched.ErrInvalidKey
// (wrapped) for a key unusable as a map key (a NaN, an interface holding a
// slice), and keysched.ErrClosed once the subscriber's Close or Unsubscribe
// has given up on unfinished events.
func (s *Subscription[K]) Resume(key K) error { return s.s.resume(key) }

// Skip gives up a parked key's head event (it was dead-lettered when the key
// parked) and moves the key on to its next event, for this subscriber.
// Errors as for Resume.
func (s *Subscription[K]) Skip(key K) error { return s.s.skip(key) }

// sub is one subscriber. Its handler's type E is hidden in match and invoke,
// so that the bus handles every subscriber alike.
type sub[K comparable] struct {
	bus    *Bus[K]
	name   string
	cfg    subConfig
	sched  *keysched.Scheduler[K]
	dl     func(DeadLetter[K]) // nil: log dead letters
	match  func(event any) bool
	invoke func(ctx context.Context, env Envelope[K]) error

	gone     atomic.Bool  // Unsubscribe started: Publish skips it
	ejected  atomic.Bool  // final
	timeouts atomic.Int64 // consecutive timed-out attempts (EjectAfter only)

	delivered, dropped, refused, skipped, ejectedDL atomic.Uint64

	// With Failure(Park): the keys that parked or are about to (a key is
	// dead-lettered just before it parks), so that ejection can skip them.
	parkMu    sync.Mutex
	parking   map[K]struct{}
	releasing bool          // a helper is skipping parked keys
	done      chan struct{} // closed, under parkMu, once the scheduler is closed
	closeErr  error
	closeOnce sync.Once
}

// Subscribe registers h on b as the subscriber name, for every event e
// published from now on for which e.(E) holds (E may be an interface). It
// creates the subscriber's scheduler on b's pool; it starts no goroutine.
//
// Errors: keysched.ErrInvalidOption (wrapped) for an empty name, a nil
// handler, a nil or bad option, a DeadLetters function for another key type,
// EjectAfter without Timeout; ErrDuplicateName; ErrClosed once Close has
// started.
func Subscribe[K comparable, E any](b *Bus[K], name string, h Handler[K, E], opts ...SubOption) (*Subscription[K], error) {
	if b == nil {
		return nil, optionError("Subscribe on a nil *Bus")
	}
	if name == "" {
		return nil, optionError("Subscribe: empty subscriber name")
	}
	if h == nil {
		return nil, optionError("Subscribe(%q): nil handler", name)
	}
	cfg := subConfig{
		maxKeyDepth: keysched.DefaultMaxKeyDepth,
		maxPending:  keysched.DefaultMaxPending,
	}
	for i, o := range opts {
		if o == nil {
			return nil, optionError("Subscribe(%q): option %d is nil", name, i)
		}
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("Subscribe(%q): %w", name, err)
		}
	}
	if cfg.ejectAfter > 0 && cfg.timeout == 0 {
		return nil, optionError("Subscribe(%q): EjectAfter needs Timeout: it counts timed-out attempts", name)
	}
	s := &sub[K]{
		bus:   b,
		name:  name,
		cfg:   cfg,
		match: func(event any) bool { _, ok := event.(E); return ok },
		invoke: func(ctx context.Context, env Envelope[K]) error {
			return h(ctx, env, env.Event.(E))
		},
		done: make(chan struct{}),
	}
	if cfg.deadLetter != nil {
		fn, ok := cfg.deadLetter.(func(DeadLetter[K]))
		if !ok {
			return nil, optionError("Subscribe(%q): DeadLetters' function takes %s, the bus's keys are %s",
				name, reflect.TypeOf(cfg.deadLetter).In(0), reflect.TypeFor[K]())
		}
		s.dl = fn
	}
	if cfg.failure == keysched.Park {
		s.parking = make(map[K]struct{})
	}
	kopts := []keysched.Option{
		keysched.WithPool(b.pool),
		keysched.WithLogger(b.logger),
		keysched.WithMaxKeyDepth(cfg.maxKeyDepth),
		keysched.WithMaxPending(cfg.maxPending),
		keysched.WithFailurePolicy(cfg.failure),
		keysched.WithDeadLetter(s.onDeadLetter),
	}
	if cfg.maxConcurrency > 0 {
		kopts = append(kopts, keysched.WithMaxConcurrency(cfg.maxConcurrency))
	}
	if cfg.retry != nil {
		kopts = append(kopts, keysched.WithRetry(*cfg.retry))
	}
	if cfg.timeout > 0 {
		kopts = append(kopts, keysched.WithTaskTimeout(cfg.timeout))
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return nil, ErrClosed
	}
	if _, dup := b.names[name]; dup {
		return nil, fmt.Errorf("%w: %q", ErrDuplicateName, name)
	}
	sched, err := keysched.New[K](kopts...)
	if err != nil {
		return nil, fmt.Errorf("Subscribe(%q): %w", name, err)
	}
	s.sched = sched
	b.names[name] = s
	b.live[s] = struct{}{}
	b.setRoutes()
	return &Subscription[K]{s: s}, nil
}

// offer hands env to the subscriber's scheduler, waiting for room if wait is
// set (and ctx is not a handler's). An unsubscribed or ejected subscriber
// takes nothing and reports no error.
func (s *sub[K]) offer(ctx context.Context, env Envelope[K], wait bool) error {
	if s.gone.Load() {
		return nil
	}
	if s.ejected.Load() {
		s.skipped.Add(1)
		return nil
	}
	// One allocation: the closure holds the subscriber and its own copy of
	// the envelope (the Headers map and the Event are shared).
	task := func(ctx context.Context) error { return s.run(ctx, env) }
	var err error
	if wait {
		_, err = s.sched.Submit(ctx, env.Key, task)
	} else {
		_, err = s.sched.TrySubmit(ctx, env.Key, task)
	}
	if err == nil {
		s.bus.accepted.Add(1)
	}
	return err
}

// refusal turns a scheduler's refusal into the reason Publish reports, and
// counts it; nil means there is nothing to report.
func (s *sub[K]) refusal(err error) error {
	full := errors.Is(err, keysched.ErrKeyFull) || errors.Is(err, keysched.ErrFull)
	switch {
	case errors.Is(err, keysched.ErrClosed):
		if s.gone.Load() {
			return nil // unsubscribed while the event was offered
		}
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	case full && s.cfg.overflow == DropNewest:
		s.dropped.Add(1)
		return fmt.Errorf("%w: %w", ErrDropped, err)
	}
	s.refused.Add(1)
	return err
}

// envProbe is a context that makes a subscriber's task report its envelope
// instead of running: how a keysched dead letter, which carries the task,
// gets back to the event.
type envProbe[K comparable] struct {
	context.Context
	env Envelope[K]
	ok  bool
}

// run is the task the subscriber's scheduler runs for one event.
func (s *sub[K]) run(ctx context.Context, env Envelope[K]) error {
	if p, ok := ctx.(*envProbe[K]); ok {
		p.env, p.ok = env, true
		return nil
	}
	if s.ejected.Load() {
		// Completed here, not by the scheduler: an error would be retried or
		// park the key. SubStats moves it from Succeeded to Failed.
		s.ejectedDL.Add(1)
		s.deadLetter(DeadLetter[K]{
			Subscriber: s.name,
			Envelope:   env,
			Attempts:   keysched.Attempt(ctx) - 1,
			Err:        ErrEjected,
		})
		return nil
	}
	if s.cfg.ejectAfter == 0 {
		err := s.invoke(ctx, env)
		if err == nil {
			s.delivered.Add(1)
		}
		return err
	}
	return s.runWatched(ctx, env)
}

// runWatched runs the handler and counts consecutive timed-out attempts.
func (s *sub[K]) runWatched(ctx context.Context, env Envelope[K]) error {
	returned := false
	defer func() {
		if !returned {
			s.timeouts.Store(0) // a panic is not a timeout: it breaks the streak
		}
	}()
	err := s.invoke(ctx, env)
	returned = true
	if err == nil {
		s.delivered.Add(1)
	}
	timedOut := ctx.Err() == context.DeadlineExceeded ||
		(err != nil && errors.Is(err, context.DeadlineExceeded))
	if !timedOut {
		s.timeouts.Store(0)
	} else if n := s.timeouts.Add(1); n >= int64(s.cfg.ejectAfter) {
		s.eject(n)
	}
	if err != nil && s.ejected.Load() {
		// The subscriber is gone: no retry.
		return keysched.Permanent(fmt.Errorf("%w: %w", ErrEjected, err))
	}
	return err
}

// eject makes the subscriber's ejection final and visible.
func (s *sub[K]) eject(n int64) {
	if !s.ejected.CompareAndSwap(false, true) {
		return
	}
	s.bus.logger.Warn("bus: subscriber ejected after consecutive timed-out attempts",
		"subscriber", s.name, "timeouts", n, "timeout", s.cfg.timeout)
	if s.parking != nil {
		s.parkMu.Lock()
		start := s.startReleaseLocked()
		s.parkMu.Unlock()
		if start {
			go s.releaseParked()
		}
	}
}

// onDeadLetter receives the scheduler's dead letters and hands them on with
// the envelope.
func (s *sub[K]) onDeadLetter(kdl keysched.DeadLetter[K]) {
	dl := DeadLetter[K]{
		Subscriber:   s.name,
		Attempts:     kdl.Attempts,
		Err:          kdl.Err,
		FirstAttempt: kdl.FirstAttempt,
		LastAttempt:  kdl.LastAttempt,
	}
	dl.Envelope.Key = kdl.Key
	if kdl.Task != nil {
		p := envProbe[K]{Context: context.Background()}
		_ = kdl.Task(&p)
		if p.ok {
			dl.Envelope = p.env
		}
	}
	if s.parking != nil && !errors.Is(kdl.Err, keysched.ErrAborted) {
		s.willPark(kdl.Key)
	}
	s.deadLetter(dl)
}

// deadLetter hands dl to the subscriber's function, or logs it.
func (s *sub[K]) deadLetter(dl DeadLetter[K]) {
	if s.dl == nil {
		s.bus.logger.Warn("bus: event dead-lettered", "subscriber", s.name, "key", dl.Envelope.Key,
			"id", dl.Envelope.ID, "attempts", dl.Attempts, "err", dl.Err)
		return
	}
	defer func() {
		if r := recover(); r != nil {
			s.bus.logger.Error("bus: dead-letter function panicked", "subscriber", s.name,
				"key", dl.Envelope.Key, "id", dl.Envelope.ID, "panic", r, "err", dl.Err)
		}
	}()
	s.dl(dl)
}

// willPark records that key parked (Failure(Park)): the scheduler parks a
// key's head, then dead-letters it.
func (s *sub[K]) willPark(key K) {
	s.parkMu.Lock()
	s.parking[key] = struct{}{}
	start := s.ejected.Load() && s.startReleaseLocked()
	s.parkMu.Unlock()
	if start {
		go s.releaseParked()
	}
}

// startReleaseLocked reports whether the caller must start releaseParked,
// and registers it with the bus. Called with parkMu held.
func (s *sub[K]) startReleaseLocked() bool {
	if s.releasing || len(s.parking) == 0 {
		return false
	}
	select {
	case <-s.done:
		return false // closed: Close no longer waits for helpers
	default:
	}
	s.releasing = true
	s.bus.helpers.Add(1)
	return true
}

// releaseParked skips the parked keys of an ejected subscriber, so that the
// events queued behind them are dead-lettered with ErrEjected. A recorded key
// is parked already (the scheduler parks before it dead-letters), but a
// concurrent Resume may have taken it and it may park again: so it looks
// again, backing off, until every recorded key has been skipped or the
// subscriber is closed. Ejection with Park is rare; this costs nothing
// otherwise.
func (s *sub[K]) releaseParked() {
	defer s.bus.helpers.Done()
	delay := 50 * time.Microsecond
	for {
		for _, k := range s.sched.Parked() {
			if s.sched.Skip(k) == nil {
				s.parkMu.Lock()
				delete(s.parking, k)
				s.parkMu.Unlock()
			}
		}
		s.parkMu.Lock()
		if len(s.parking) == 0 {
			s.releasing = false
			s.parkMu.Unlock()
			return
		}
		s.parkMu.Unlock()
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-s.done:
			t.Stop()
			s.parkMu.Lock()
			s.releasing = false
			s.parkMu.Unlock()
			return
		}
		delay = min(2*delay, 10*time.Millisecond)
	}
}

func (s *sub[K]) unsubscribe(ctx context.Context) error {
	if ctx == nil {
		return keysched.ErrNilContext
	}
	if keysched.Attempt(ctx) > 0 {
		return fmt.Errorf("bus: unsubscribe %q: %w", s.name, keysched.ErrInsideTask)
	}
	b := s.bus
	b.mu.Lock()
	if !s.gone.Load() {
		s.gone.Store(true)
		if b.names[s.name] == s {
			delete(b.names, s.name)
			b.setRoutes()
		}
	}
	b.mu.Unlock()
	return s.shutdown(ctx)
}

// shutdown closes the subscriber's scheduler (idempotent: later calls wait
// for the first one's result, or their ctx).
func (s *sub[K]) shutdown(ctx context.Context) error {
	first := false
	s.closeOnce.Do(func() { first = true })
	if !first {
		select {
		case <-s.done:
			return s.closeErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := s.sched.Close(ctx)
	if err != nil {
		err = fmt.Errorf("subscriber %q: %w", s.name, err)
	}
	s.closeErr = err
	s.parkMu.Lock()
	close(s.done)
	s.parkMu.Unlock()
	b := s.bus
	b.mu.Lock()
	delete(b.live, s)
	b.mu.Unlock()
	return err
}

func (s *sub[K]) drain(ctx context.Context) error {
	if ctx == nil {
		return keysched.ErrNilContext
	}
	if err := s.sched.Drain(ctx); err != nil {
		return fmt.Errorf("bus: drain %q: %w", s.name, err)
	}
	return nil
}

func (s *sub[K]) stats() SubStats {
	st := s.sched.Stats()
	ej := s.ejectedDL.Load()
	st.Succeeded -= min(ej, st.Succeeded)
	st.Failed += ej
	st.DeadLettered += ej
	st.Rejected = s.refused.Load()
	return SubStats{
		Stats:         st,
		Delivered:     s.delivered.Load(),
		Dropped:       s.dropped.Load(),
		Skipped:       s.skipped.Load(),
		Ejected:       s.ejected.Load(),
		EjectedEvents: ej,
	}
}

func (s *sub[K]) resume(k K) error {
	if err := s.sched.Resume(k); err != nil {
		return err
	}
	s.unparked(k)
	return nil
}

func (s *sub[K]) skip(k K) error {
	if err := s.sched.Skip(k); err != nil {
		return err
	}
	s.unparked(k)
	return nil
}

func (s *sub[K]) unparked(k K) {
	if s.parking == nil {
		return
	}
	s.parkMu.Lock()
	delete(s.parking, k)
	s.parkMu.Unlock()
}
