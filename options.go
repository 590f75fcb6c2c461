package keysched

import (
	"log/slog"
	"time"

	"github.com/panjf2000/ants/v2"

	"github.com/keysched/keysched/internal/optcheck"
)

// Defaults for the bounds New applies when no option sets them.
const (
	// DefaultWorkers is the size of the scheduler's own ants pool. Workers
	// bound how many tasks run at once; size them for the slowest handler:
	// throughput (tasks/s) times handler latency (s), about.
	DefaultWorkers = 64
	// DefaultMaxKeyDepth bounds each key's queued plus running tasks.
	DefaultMaxKeyDepth = 1024
	// DefaultMaxPending bounds accepted, unfinished tasks over all keys.
	// A queued task costs about 100 bytes (an 80-byte node for int or
	// string keys, a 16-byte map entry, a share of the map's table), so the
	// default bounds queued memory near 7 MiB.
	DefaultMaxPending = 65536
)

// keyBudget is how many tasks of one key a worker runs back to back before it
// puts the key at the back of the ready queue, so one busy key cannot
// monopolise a worker while others wait.
const keyBudget = 32

// An Option configures New. Options are checked when New runs: a bad value
// makes New return an *OptionError (errors.Is(err, ErrInvalidOption) holds).
//
// How options meet. This is the one rule for options that bear on each
// other; every module of keysched (the bus, the Kafka adapter, the outbox
// and its relay, the inbox, otelkeysched) and the webhook service follow it
// for theirs, and say so. Their refusals are *OptionError too (see there),
// made by the same checks, so that a refused option reads and is handled
// alike whichever module refused it.
//
//   - Options apply in order, and a later option replaces an earlier one of
//     the same name: WithWorkers(2), WithWorkers(3) means 3 workers. Code
//     that wraps New can so put its own defaults first and its caller's
//     options after them.
//   - Bounds nest: tasks running at once (WithMaxConcurrency) within the
//     workers (WithWorkers, or the size of WithPool's pool); one key's tasks
//     (WithMaxKeyDepth) within all tasks (WithMaxPending). When both bounds
//     of a pair are given and the inner one is larger, the outer one applies
//     first (it is the resource: workers, memory) and the inner one is never
//     reached: WithMaxKeyDepth(100) with WithMaxPending(10) holds at most 10
//     tasks of a key, and TrySubmit then fails with ErrFull, not ErrKeyFull;
//     WithMaxConcurrency(1000) with WithWorkers(4) runs at most 4 at once.
//   - A default gives way to a bound given: WithMaxKeyDepth(n) alone, with
//     n above DefaultMaxPending, raises the pending bound to n;
//     WithMaxConcurrency(n) alone, with n above DefaultWorkers (or with an
//     unbounded pool), sizes the scheduler's pool to n. A default inner
//     bound above a given outer one stays, unreachable: WithMaxPending(10)
//     alone holds at most 10 tasks of any key.
//   - Options that set the same thing two ways, or that contradict each
//     other, are refused: WithWorkers with WithPool (both set the pool)
//     makes New fail with an *OptionError naming both (Option
//     "WithWorkers", With "WithPool"). A pair is clamped as nested bounds
//     only where the outer bound applying first is harmless (it delays
//     work); where it would make work fail, the pair is refused (the
//     outbox relay's WithSinkTimeout above half its WithLeaseDuration).
type Option func(*config) error

type config struct {
	workers        int // 0: not given
	pool           *ants.Pool
	maxKeyDepth    int
	maxPending     int
	depthSet       bool // WithMaxKeyDepth given
	pendingSet     bool // WithMaxPending given
	maxConcurrency int
	retry          RetryPolicy
	retrySet       bool
	retryPanics    bool
	taskTimeout    time.Duration
	failure        FailurePolicy
	deadLetter     any // func(DeadLetter[K]) for the scheduler's K
	logger         *slog.Logger
	observer       any  // *Observer[K] for the scheduler's K (observe.go)
	taskAges       bool // stamp tasks when accepted (observe.go)
}

func defaultConfig() config {
	return config{
		maxKeyDepth: DefaultMaxKeyDepth,
		maxPending:  DefaultMaxPending,
		logger:      slog.Default(),
	}
}

// WithWorkers sets the size of the scheduler's own ants pool: at most n tasks
// run at once (default DefaultWorkers, or a larger WithMaxConcurrency). Close
// releases that pool. n must be at least 1; with WithPool, New fails (see
// Option for how options meet).
func WithWorkers(n int) Option {
	return func(c *config) error {
		if r := optcheck.Workers("WithWorkers", n); r != nil {
			return refused(r)
		}
		c.workers = n
		return nil
	}
}

// WithPool runs the scheduler's tasks on p, a pool the caller owns and may
// share with other schedulers and code. Close does not release p; releasing p
// while the scheduler still has work makes the remaining work run on plain
// goroutines. At most p.Cap() tasks of this scheduler run at once (see
// WithMaxConcurrency to lower that). No call of the scheduler waits for a
// worker of p: when p is full of other work, the scheduler's ready tasks wait
// until a worker frees up (a non-blocking pool is retried every millisecond).
// Close does not wait for such a worker either.
func WithPool(p *ants.Pool) Option {
	return func(c *config) error {
		if r := optcheck.Pool("WithPool", p); r != nil {
			return refused(r)
		}
		c.pool = p
		return nil
	}
}

// WithMaxKeyDepth bounds the tasks one key may hold, queued plus running
// (default DefaultMaxKeyDepth). A key at the bound makes Submit wait and
// TrySubmit fail with ErrKeyFull: backpressure on the hot key only. n >= 1.
// Above the pending bound it is never reached (WithMaxPending applies
// first); above DefaultMaxPending without WithMaxPending, it raises the
// pending bound to n (see Option for how options meet).
func WithMaxKeyDepth(n int) Option {
	return func(c *config) error {
		if r := optcheck.AtLeast("WithMaxKeyDepth", n, 1); r != nil {
			return refused(r)
		}
		c.maxKeyDepth, c.depthSet = n, true
		return nil
	}
}

// WithMaxPending bounds the accepted, unfinished tasks of the whole scheduler
// (default DefaultMaxPending): the memory bound. At the bound Submit waits and
// TrySubmit fails with ErrFull. n >= 1. A key depth above it is never
// reached (see Option for how options meet).
func WithMaxPending(n int) Option {
	return func(c *config) error {
		if r := optcheck.AtLeast("WithMaxPending", n, 1); r != nil {
			return refused(r)
		}
		c.maxPending, c.pendingSet = n, true
		return nil
	}
}

// WithMaxConcurrency bounds how many tasks of this scheduler run at once,
// below the pool's size: a bulkhead, so that several schedulers sharing one
// pool (WithPool) cannot take all of it. n >= 1; default: the pool's size.
// Above the size of WithPool's pool (as it is when New runs) or of
// WithWorkers, n has no effect; without either, an n above DefaultWorkers
// sizes the scheduler's own pool to n, as does any n with an unbounded pool
// (see Option for how options meet).
func WithMaxConcurrency(n int) Option {
	return func(c *config) error {
		if r := optcheck.AtLeast("WithMaxConcurrency", n, 1); r != nil {
			return refused(r)
		}
		c.maxConcurrency = n
		return nil
	}
}

// WithLogger sets where the scheduler logs what it cannot return: failed tasks
// when no dead-letter function is set, panics in a dead-letter function, a
// shared pool that refuses work. Default slog.Default(). nil is an error; use
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

// resolve applies the rule of Option to the options given (see Option: how
// options meet), after they all applied: the defaults give way to the bounds
// given, and WithWorkers with WithPool is refused.
func (c *config) resolve() error {
	if c.pool != nil && c.workers != 0 {
		return refused(optcheck.WorkersWithPool("WithWorkers", "WithPool"))
	}
	if c.depthSet && !c.pendingSet && c.maxKeyDepth > c.maxPending {
		c.maxPending = c.maxKeyDepth
	}
	if c.pool == nil && c.workers == 0 && c.maxConcurrency > DefaultWorkers {
		c.workers = min(c.maxConcurrency, optcheck.MaxWorkers)
	}
	return nil
}
