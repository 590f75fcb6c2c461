package bus

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/optcheck"
)

// This file holds Subscribe: a handler and its options become a subscriber,
// with a scheduler of its own on the bus's pool.

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
	succeededFloor                                  atomic.Uint64 // the largest SubStats.Succeeded reported (stats.go)

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
// started; ErrZeroBus (with keysched.ErrInvalidOption) for a nil or zero b.
func Subscribe[K comparable, E any](b *Bus[K], name string, h Handler[K, E], opts ...SubOption) (*Subscription[K], error) {
	if b.zero() {
		// Both: a bad argument, as before ErrZeroBus existed.
		return nil, fmt.Errorf("%w: Subscribe refused (%w)", ErrZeroBus, keysched.ErrInvalidOption)
	}
	if name == "" {
		return nil, argError("Subscribe: empty subscriber name")
	}
	if h == nil {
		return nil, argError("Subscribe(%q): nil handler", name)
	}
	cfg := subConfig{maxKeyDepth: keysched.DefaultMaxKeyDepth}
	for i, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("Subscribe(%q): %w", name, refused(optcheck.NilOption(i, "SubOption")))
		}
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("Subscribe(%q): %w", name, err)
		}
	}
	if cfg.ejectAfter > 0 && cfg.timeout == 0 {
		return nil, fmt.Errorf("Subscribe(%q): %w", name, refused(optcheck.Conflict("EjectAfter", "Timeout", "needs Timeout: it counts timed-out attempts")))
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
			return nil, fmt.Errorf("Subscribe(%q): %w", name, refused(optcheck.Refuse("DeadLetters", nil, "the function takes %s, the bus's keys are %s",
				reflect.TypeOf(cfg.deadLetter).In(0), reflect.TypeFor[K]())))
		}
		s.dl = fn
	}
	if cfg.failure == keysched.Park {
		s.parking = make(map[K]struct{})
	}
	kopts := []keysched.Option{
		keysched.WithPool(b.pool),
		keysched.WithLogger(b.logger),
		keysched.WithDeadLetter(s.onDeadLetter),
	}
	kopts = append(kopts, cfg.sched...)

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
		// Name a refused option as the caller wrote it: the SubOption,
		// not the scheduler option it became.
		var oe *keysched.OptionError
		if errors.As(err, &oe) && subOptionOf[oe.Option] != "" {
			named := *oe
			named.Option = subOptionOf[oe.Option]
			err = fmt.Errorf("bus: %w", &named)
		}
		return nil, fmt.Errorf("Subscribe(%q): %w", name, err)
	}
	s.sched = sched
	b.names[name] = s
	b.live[s] = struct{}{}
	b.setRoutes()
	return &Subscription[K]{s: s}, nil
}
