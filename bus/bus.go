package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/optcheck"
	"github.com/keysched/keysched/internal/opterror"
	"github.com/panjf2000/ants/v2"
)

// DefaultWorkers is the size of the bus's own ants pool when neither
// WithWorkers nor WithPool is given: at most this many handlers, of all
// subscribers together, run at once.
const DefaultWorkers = keysched.DefaultWorkers

// Sentinel errors. Compare with errors.Is: returned errors often wrap one of
// these together with a cause.
var (
	// ErrClosed is returned by Publish, PublishEnvelope and Subscribe once
	// Close has started. Inside a *PublishError it names a subscriber whose
	// scheduler closed while the event was being offered to it.
	ErrClosed = errors.New("bus: closed")
	// ErrEjected is the dead-letter error of an event that a subscriber did
	// not handle because it was ejected (EjectAfter). The attempt whose
	// timeout caused the ejection is dead-lettered with an error that wraps
	// both ErrEjected and context.DeadlineExceeded.
	ErrEjected = errors.New("bus: subscriber ejected")
	// ErrDropped is the reason a DropNewest subscriber gives, in a
	// *PublishError, for an event it dropped; it is wrapped together with
	// keysched.ErrKeyFull or keysched.ErrFull.
	ErrDropped = errors.New("bus: event dropped (DropNewest)")
	// ErrNilEvent is returned by Publish for a nil event: nothing can route it.
	ErrNilEvent = errors.New("bus: nil event")
	// ErrDuplicateName is returned by Subscribe for a name already in use on
	// the bus. A name is free again once Unsubscribe has been called, before
	// it returns: the new subscriber is another one, and its events of a key
	// may run while the old one's still drain (order holds per subscriber).
	// Subscribe again after Unsubscribe returned nil when the order of a key
	// matters across the two.
	ErrDuplicateName = errors.New("bus: subscriber name already in use")
	// ErrZeroBus is returned by the error-returning methods of a nil or
	// zero-value Bus (one not made by New), and by Subscribe on one; its
	// other methods return zero values.
	ErrZeroBus = errors.New("bus: nil or zero Bus (make one with New)")
	// ErrZeroSubscription is returned by the error-returning methods of a
	// nil or zero-value Subscription (one not returned by Subscribe); its
	// other methods return zero values.
	ErrZeroSubscription = errors.New("bus: nil or zero Subscription (make one with Subscribe)")
	// ErrNoSubscriber is returned by PublishEnvelopeStrict for an event
	// that no subscriber matched: nothing took it. Publish and
	// PublishEnvelope return nil for such an event (it only counts in
	// Stats.Unmatched).
	ErrNoSubscriber = errors.New("bus: no subscriber takes the event's type")
)

// An Envelope is one published event with its metadata. Handlers receive it
// by value; dead letters carry it, so that an event can be replayed on
// purpose.
type Envelope[K comparable] struct {
	// ID is the producer-assigned event id. PublishEnvelope generates a
	// UUIDv7 (time-ordered, RFC 9562) when it is empty. Dedup keys on it.
	ID  string
	Key K
	// Event is the payload; its dynamic type routes it. Never nil.
	Event any
	// Headers carries metadata such as a correlation id, to handlers and
	// dead letters. The map is shared by every subscriber's copy of the
	// envelope and Publish does not copy it: neither the publisher nor a
	// handler may modify it after publishing.
	Headers map[string]string
	// Published is when the event was published; PublishEnvelope sets it
	// to time.Now() when it is zero.
	Published time.Time
}

// PublishError reports the subscribers that refused an event: Refused maps
// each one's name to why (an error wrapping keysched.ErrKeyFull or
// keysched.ErrFull, possibly with ErrDropped or the context's error;
// ErrClosed; ...). The subscribers not named accepted the event. errors.Is
// and errors.As see every reason through Unwrap.
type PublishError struct {
	Refused map[string]error
}

func (e *PublishError) names() []string {
	names := make([]string, 0, len(e.Refused))
	for n := range e.Refused {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Error lists the refusing subscribers, sorted by name.
func (e *PublishError) Error() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "bus: publish refused by %d subscriber(s)", len(e.Refused))
	for i, n := range e.names() {
		if i == 0 {
			sb.WriteString(": ")
		} else {
			sb.WriteString("; ")
		}
		fmt.Fprintf(&sb, "%q: %v", n, e.Refused[n])
	}
	return sb.String()
}

// Unwrap returns the reasons, in the order of the subscribers' names.
func (e *PublishError) Unwrap() []error {
	errs := make([]error, 0, len(e.Refused))
	for _, n := range e.names() {
		errs = append(errs, e.Refused[n])
	}
	return errs
}

// An Option configures New. A bad option makes New return an error wrapping a
// *keysched.OptionError that names it (errors.Is(err,
// keysched.ErrInvalidOption) holds), checked as the scheduler's option of
// the same name is. Options meet by keysched.Option's rule (the one rule of
// every keysched module; see its "How options meet"): the last of a name
// wins, and WithWorkers with WithPool is refused (both set the pool).
type Option func(*config) error

type config struct {
	workers int
	pool    *ants.Pool
	logger  *slog.Logger
}

// WithWorkers sets the size of the bus's own ants pool (default
// DefaultWorkers), shared by every subscriber: at most n handlers run at
// once over the whole bus. Close releases that pool. n from 1 to
// math.MaxInt32 (ants sizes pools with an int32); not with WithPool.
func WithWorkers(n int) Option {
	return func(c *config) error {
		if r := optcheck.Workers("WithWorkers", n); r != nil {
			return refused(r)
		}
		c.workers = n
		return nil
	}
}

// WithPool runs every subscriber on p, a pool the caller owns and may share
// with other code. Close does not release p. Publish never waits for a
// worker of p: when p is full of other work, accepted events wait for a free
// worker (see keysched.WithPool). Not with WithWorkers.
func WithPool(p *ants.Pool) Option {
	return func(c *config) error {
		if r := optcheck.Pool("WithPool", p); r != nil {
			return refused(r)
		}
		c.pool = p
		return nil
	}
}

// WithLogger sets where the bus logs what it cannot return: ejections, dead
// letters of subscribers without a DeadLetters function, panics in a
// dead-letter function (default slog.Default()). nil is an error; use
// slog.New(slog.DiscardHandler) to silence it.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if r := optcheck.Logger("WithLogger", l); r != nil {
			return refused(r)
		}
		c.logger = l
		return nil
	}
}

// refused is the error of a refused bus option: r's *keysched.OptionError,
// as the core's refusals are, wrapped "bus: ..."; nil for a nil r.
func refused(r *optcheck.Refusal) error {
	if r == nil {
		return nil
	}
	return fmt.Errorf("bus: %w", opterror.New(nil, r))
}

// argError refuses an argument that is not an option (a subscriber's name,
// its handler), wrapping keysched.ErrInvalidOption.
func argError(format string, args ...any) error {
	return fmt.Errorf("bus: %w: "+format, append([]any{keysched.ErrInvalidOption}, args...)...)
}

// A Bus routes published events to the subscribers of their type, running
// the handlers on one bounded pool of workers. Events of one key reach each
// subscriber in publication order; different keys, and different
// subscribers, run concurrently.
//
// All methods are safe for concurrent use. The zero Bus is not usable: call
// New. On a nil or zero Bus, methods return ErrZeroBus or zero values.
type Bus[K comparable] struct {
	pool    *ants.Pool
	ownPool bool
	logger  *slog.Logger

	mu    sync.Mutex           // guards names, live and the routing snapshot's replacement
	names map[string]*sub[K]   // subscribed and not unsubscribed
	live  map[*sub[K]]struct{} // every subscriber whose scheduler Close must still close
	// lingering holds the subscribers whose Close (or Unsubscribe) gave up
	// with work left in the background (running handlers, dead letters):
	// Drain waits for it, then forgets them.
	lingering map[*sub[K]]struct{}
	routes    atomic.Pointer[routing[K]]
	closed    atomic.Bool // set under mu when Close starts

	closeOnce sync.Once
	closeDone chan struct{}
	closeErr  error

	accepted  atomic.Uint64 // deliveries accepted by subscribers: Drain's progress mark
	published atomic.Uint64
	unmatched atomic.Uint64

	helpers sync.WaitGroup // goroutines releasing an ejected subscriber's parked keys
}

// New returns a bus for keys of type K. It starts its own ants pool of
// DefaultWorkers workers unless WithWorkers or WithPool says otherwise; call
// Close to release it. It fails, with an error wrapping
// keysched.ErrInvalidOption, for a bad option.
func New[K comparable](opts ...Option) (*Bus[K], error) {
	cfg := config{logger: slog.Default()}
	for i, o := range opts {
		if o == nil {
			return nil, refused(optcheck.NilOption(i, "Option"))
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.pool != nil && cfg.workers != 0 {
		return nil, refused(optcheck.WorkersWithPool("WithWorkers", "WithPool"))
	}
	b := &Bus[K]{
		logger:    cfg.logger,
		names:     make(map[string]*sub[K]),
		live:      make(map[*sub[K]]struct{}),
		lingering: make(map[*sub[K]]struct{}),
		closeDone: make(chan struct{}),
	}
	if cfg.pool != nil {
		b.pool = cfg.pool
	} else {
		n := cfg.workers
		if n == 0 {
			n = DefaultWorkers
		}
		p, err := ants.NewPool(n)
		if err != nil {
			return nil, fmt.Errorf("bus: %w", &keysched.OptionError{Option: "WithWorkers", Value: fmt.Sprint(n), Reason: "ants.NewPool refused it", Err: err})
		}
		b.pool, b.ownPool = p, true
	}
	b.routes.Store(&routing[K]{})
	return b, nil
}

// routing is an immutable list of subscribers with a cache, per dynamic event
// type, of those that match it. Subscribe and Unsubscribe replace it.
type routing[K comparable] struct {
	subs   []*sub[K]
	byType sync.Map // reflect.Type -> []*sub[K]
	cached atomic.Int32
}

// maxCachedTypes bounds the routing cache: events of more distinct dynamic
// types than this are matched by a scan of the subscribers.
const maxCachedTypes = 4096

// route returns the subscribers whose type event matches. A type assertion's
// outcome depends only on the dynamic type, so the answer is cached per type.
func (r *routing[K]) route(event any) []*sub[K] {
	if len(r.subs) == 0 {
		return nil
	}
	t := reflect.TypeOf(event)
	if v, ok := r.byType.Load(t); ok {
		return v.([]*sub[K])
	}
	var out []*sub[K]
	for _, s := range r.subs {
		if s.match(event) {
			out = append(out, s)
		}
	}
	if r.cached.Add(1) <= maxCachedTypes {
		r.byType.Store(t, out)
	}
	return out
}

// setRoutes publishes a new routing snapshot. Called with b.mu held.
func (b *Bus[K]) setRoutes() {
	subs := make([]*sub[K], 0, len(b.names))
	for _, s := range b.names {
		subs = append(subs, s)
	}
	// A stable fan-out order (by name) makes behaviour reproducible.
	sort.Slice(subs, func(i, j int) bool { return subs[i].name < subs[j].name })
	b.routes.Store(&routing[K]{subs: subs})
}

// Publish publishes event for key: PublishEnvelope with an envelope holding
// only them.
func (b *Bus[K]) Publish(ctx context.Context, key K, event any) error {
	return b.PublishEnvelope(ctx, Envelope[K]{Key: key, Event: event})
}

// PublishEnvelope offers env to every subscriber whose type env.Event
// matches (see the package doc), filling in an empty ID (a UUIDv7) and a
// zero Published (time.Now()). It returns nil when every matching subscriber
// accepted the event, or when none matches (the event is counted as
// unmatched; PublishEnvelopeStrict makes that an error, ErrNoSubscriber).
//
// A subscriber at one of its bounds applies its OverflowPolicy: Block waits
// for room until ctx ends, Reject refuses, DropNewest drops and counts. The
// non-waiting offers are made first, so while Publish waits for a full
// Block subscriber the others already have the event. When some subscribers
// refused, it returns a *PublishError naming each of them with its reason;
// the others keep the event. An ejected or unsubscribed subscriber is
// skipped, which is not an error (an ejected one counts it in
// SubStats.Skipped).
//
// With a handler's context or a DeadLetter's Context (or one derived from
// them) Publish never waits: a
// full Block subscriber refuses at once, with keysched.ErrKeyFull or
// keysched.ErrFull.
//
// Other errors, with nothing published: keysched.ErrNilContext, ErrNilEvent,
// ErrClosed once Close has started, ctx's error when it has ended already,
// keysched.ErrInvalidKey for a key unusable as a map key (found by the first
// matching subscriber: an event no subscriber matches is only counted), and
// a failure to generate the ID.
func (b *Bus[K]) PublishEnvelope(ctx context.Context, env Envelope[K]) error {
	return b.publish(ctx, env, false)
}

// PublishEnvelopeStrict is PublishEnvelope for a publisher that must not
// lose an event nobody received, such as a durable outbox's relay: when no
// subscriber matches env.Event's dynamic type (none was subscribed to it
// when the bus routed the event: a subscriber of T does not match a *T, and
// one subscribed after the call does not get it), it returns an error
// wrapping ErrNoSubscriber that names the type, where PublishEnvelope
// returns nil. The event still counts in Stats.Published and
// Stats.Unmatched. The answer comes from the same routing snapshot that the
// event is offered by, so a concurrent Subscribe or Unsubscribe cannot make
// it wrong: either the event was offered to a subscriber or the error says
// it was not. When no subscriber it matched took it (each was ejected by
// EjectAfter, which skips events, or unsubscribed while the event was
// offered to it), the error wraps ErrNoSubscriber too. Every other behaviour
// and error is PublishEnvelope's.
func (b *Bus[K]) PublishEnvelopeStrict(ctx context.Context, env Envelope[K]) error {
	return b.publish(ctx, env, true)
}

// publish is PublishEnvelope; strict makes an unmatched event an error
// (PublishEnvelopeStrict).
func (b *Bus[K]) publish(ctx context.Context, env Envelope[K], strict bool) error {
	if b.zero() {
		return ErrZeroBus
	}
	if ctx == nil {
		return keysched.ErrNilContext
	}
	if env.Event == nil {
		return ErrNilEvent
	}
	if b.closed.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	targets := b.routes.Load().route(env.Event)
	b.published.Add(1)
	if len(targets) == 0 {
		b.unmatched.Add(1)
		if strict {
			return fmt.Errorf("%w: %T", ErrNoSubscriber, env.Event)
		}
		return nil
	}
	if env.ID == "" {
		id, err := uuid.NewV7()
		if err != nil {
			return fmt.Errorf("bus: generating the event id: %w", err)
		}
		env.ID = id.String()
	}
	if env.Published.IsZero() {
		env.Published = time.Now()
	}
	inTask := insideHandler(ctx)

	var refused map[string]error
	refuse := func(s *sub[K], err error) {
		if refused == nil {
			refused = make(map[string]error)
		}
		refused[s.name] = err
	}
	var later []*sub[K] // Block subscribers full on this key: offered last
	accepted := false
	for _, s := range targets {
		if !inTask && s.cfg.overflow == Block && s.sched.KeyDepth(env.Key) >= s.cfg.maxKeyDepth {
			later = append(later, s)
			continue
		}
		// First offer without waiting, so that while Publish waits for a full
		// Block subscriber below, the others already have the event.
		block := s.cfg.overflow == Block
		taken, err := s.offer(ctx, env, false)
		accepted = accepted || taken
		if err == nil {
			continue
		}
		if block && !inTask && (errors.Is(err, keysched.ErrKeyFull) || errors.Is(err, keysched.ErrFull)) {
			later = append(later, s)
			continue
		}
		if errors.Is(err, keysched.ErrInvalidKey) {
			// Unusable for every subscriber: none accepted it, and it did
			// not get past validation, so Stats.Published does not count it.
			b.published.Add(^uint64(0))
			return err
		}
		if err = s.refusal(err); err != nil {
			refuse(s, err)
		}
	}
	for _, s := range later {
		taken, err := s.offer(ctx, env, true)
		accepted = accepted || taken
		if err == nil {
			continue
		}
		if err = s.refusal(err); err != nil {
			refuse(s, err)
		}
	}
	if refused != nil {
		return &PublishError{Refused: refused}
	}
	if strict && !accepted {
		// Every subscriber it matched was ejected (EjectAfter: it skips
		// events) or unsubscribed while it was offered (refusal skips
		// those without an error).
		return fmt.Errorf("%w: %T (its subscribers were ejected or unsubscribed while it was offered)", ErrNoSubscriber, env.Event)
	}
	return nil
}

// Drain waits until every event published so far has been handled (or
// dead-lettered) by every subscriber, including the events their handlers
// published meanwhile, or until ctx ends. With publishers still at work it
// may also wait for events published while it waits. A subscriber's parked
// keys (Failure(Park)) hold their events: Drain waits for them to be resumed
// or skipped. When ctx ends first it returns an error wrapping ctx's error
// that names a subscriber with unfinished events. With a handler's context (or a DeadLetter's Context) it
// returns keysched.ErrInsideTask.
//
// After a Close (or an Unsubscribe) that gave up, Drain also waits for what
// it left in the background: handlers still running and dead letters still
// being delivered. A process about to exit after such a Close should call
// it, with a deadline of its own, or those dead letters are lost with it.
func (b *Bus[K]) Drain(ctx context.Context) error {
	if b.zero() {
		return ErrZeroBus
	}
	if ctx == nil {
		return keysched.ErrNilContext
	}
	if insideHandler(ctx) {
		return fmt.Errorf("bus: drain: %w", keysched.ErrInsideTask)
	}
	for {
		mark := b.accepted.Load()
		for _, s := range b.liveSubs() {
			if err := s.sched.Drain(ctx); err != nil {
				return fmt.Errorf("bus: drain: subscriber %q: %w", s.name, err)
			}
		}
		for _, s := range b.lingeringSubs() {
			if err := s.sched.Drain(ctx); err != nil {
				return fmt.Errorf("bus: drain: closed subscriber %q: %w", s.name, err)
			}
			b.mu.Lock()
			delete(b.lingering, s)
			b.mu.Unlock()
		}
		// A handler that published while a later subscriber was drained
		// moved the mark: look again.
		if b.accepted.Load() == mark {
			return nil
		}
	}
}

func (b *Bus[K]) liveSubs() []*sub[K] { return b.subsOf(b.live) }

func (b *Bus[K]) lingeringSubs() []*sub[K] { return b.subsOf(b.lingering) }

// subsOf returns m's subscribers sorted by name, read under b.mu.
func (b *Bus[K]) subsOf(m map[*sub[K]]struct{}) []*sub[K] {
	b.mu.Lock()
	defer b.mu.Unlock()
	subs := make([]*sub[K], 0, len(m))
	for s := range m {
		subs = append(subs, s)
	}
	sort.Slice(subs, func(i, j int) bool { return subs[i].name < subs[j].name })
	return subs
}

// Close shuts the bus down. From the moment it starts, Publish and Subscribe
// fail with ErrClosed (handlers publishing while the bus drains get it too).
// Then every subscriber is closed at once, each waiting for its accepted
// events to be handled; then Close releases the bus's own pool (not one given
// with WithPool), waiting for its workers to exit, and returns nil.
//
// If ctx ends first, each subscriber cancels its running handlers' contexts
// and dead-letters every event that did not run with keysched.ErrAborted;
// Close returns an error, wrapping keysched.ErrAborted and ctx's error, that
// says per subscriber how many events did not run (each subscriber's
// *keysched.CloseError, found with errors.As). Then it returns within
// keysched.CloseGrace of ctx ending, however many events are queued: dead
// letters not yet delivered by then are still delivered, in the background,
// and counted in the error. A handler that ignores its context keeps its
// worker until it returns.
//
// Close also waits, up to ctx's end, for what an earlier Unsubscribe that
// gave up left in the background (handlers still running, dead letters
// still being delivered), and for a subscriber an Unsubscribe is still
// closing; if ctx ends first, its error names that subscriber and wraps
// ctx's error (the Unsubscribe, with its own context, goes on).
//
// Close is idempotent: later calls wait for the first to finish (or their
// own ctx to end) and return its result. With a handler's context (or a DeadLetter's Context) it returns
// keysched.ErrInsideTask and does nothing.
func (b *Bus[K]) Close(ctx context.Context) error {
	if b.zero() {
		return ErrZeroBus
	}
	if ctx == nil {
		return keysched.ErrNilContext
	}
	if insideHandler(ctx) {
		return fmt.Errorf("bus: close: %w", keysched.ErrInsideTask)
	}
	first := false
	b.closeOnce.Do(func() { first = true })
	if !first {
		select {
		case <-b.closeDone:
			return b.closeErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b.mu.Lock()
	b.closed.Store(true)
	b.mu.Unlock()
	// Subscribers whose Unsubscribe gave up: their background work (running
	// handlers, dead letters) is waited for too, as Drain does.
	gone := b.lingeringSubs()
	subs := b.liveSubs()
	errs := make([]error, len(subs), len(subs)+len(gone))
	var wg sync.WaitGroup
	for i, s := range subs {
		wg.Go(func() { errs[i] = s.shutdown(ctx) })
	}
	wg.Wait()
	b.helpers.Wait()
	for _, s := range gone {
		if err := s.sched.Drain(ctx); err != nil {
			errs = append(errs, fmt.Errorf("unsubscribed subscriber %q: %w", s.name, err))
			continue
		}
		b.mu.Lock()
		delete(b.lingering, s)
		b.mu.Unlock()
	}
	err := errors.Join(errs...)
	if b.ownPool {
		if err != nil || ctx.Err() != nil {
			b.pool.Release() // some handler may still run: do not wait for it
		} else if rerr := b.pool.ReleaseContext(ctx); rerr != nil && !errors.Is(rerr, ants.ErrPoolClosed) {
			err = fmt.Errorf("bus: close: releasing the pool: %w", rerr)
		}
	}
	if err != nil {
		err = fmt.Errorf("bus: close: %w", err)
	}
	b.closeErr = err
	close(b.closeDone)
	return err
}

// Stats is a snapshot of a bus's counters.
type Stats struct {
	Subscribers int    // subscribed and not unsubscribed
	Published   uint64 // Publish calls that got past validation (ErrClosed, ErrInvalidKey and the like excluded)
	Unmatched   uint64 // of those, events no subscriber matched
}

// Stats returns a snapshot of the bus's counters.
func (b *Bus[K]) Stats() Stats {
	if b.zero() {
		return Stats{}
	}
	b.mu.Lock()
	n := len(b.names)
	b.mu.Unlock()
	return Stats{Subscribers: n, Published: b.published.Load(), Unmatched: b.unmatched.Load()}
}

// Subscriptions returns the subscribers' names, sorted.
func (b *Bus[K]) Subscriptions() []string {
	if b.zero() {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	names := make([]string, 0, len(b.names))
	for n := range b.names {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// zero reports a nil or zero-value Bus (not made by New).
func (b *Bus[K]) zero() bool { return b == nil || b.closeDone == nil }
