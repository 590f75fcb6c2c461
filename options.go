package keysched

import (
	"log/slog"
	"math"
	"time"

	"github.com/panjf2000/ants/v2"
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
// makes New return an error wrapping ErrInvalidOption.
type Option func(*config) error

type config struct {
	workers        int
	pool           *ants.Pool
	maxKeyDepth    int
	maxPending     int
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
// run at once (default DefaultWorkers). Close releases that pool. n must be at
// least 1; it cannot be combined with WithPool.
func WithWorkers(n int) Option {
	return func(c *config) error {
		if n < 1 || n > math.MaxInt32 {
			return optionError("WithWorkers(%d): need 1 to %d workers (ants sizes pools with an int32)", n, math.MaxInt32)
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
		if p == nil {
			return optionError("WithPool(nil)")
		}
		if p.IsClosed() {
			return optionError("WithPool: the pool is already released")
		}
		c.pool = p
		return nil
	}
}

// WithMaxKeyDepth bounds the tasks one key may hold, queued plus running
// (default DefaultMaxKeyDepth). A key at the bound makes Submit wait and
// TrySubmit fail with ErrKeyFull: backpressure on the hot key only. n >= 1.
func WithMaxKeyDepth(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return optionError("WithMaxKeyDepth(%d): need at least 1", n)
		}
		c.maxKeyDepth = n
		return nil
	}
}

// WithMaxPending bounds the accepted, unfinished tasks of the whole scheduler
// (default DefaultMaxPending): the memory bound. At the bound Submit waits and
// TrySubmit fails with ErrFull. n >= 1.
func WithMaxPending(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return optionError("WithMaxPending(%d): need at least 1", n)
		}
		c.maxPending = n
		return nil
	}
}

// WithMaxConcurrency bounds how many tasks of this scheduler run at once,
// below the pool's size: a bulkhead, so that several schedulers sharing one
// pool (WithPool) cannot take all of it. n >= 1; default: the pool's size (a
// larger n has no effect).
func WithMaxConcurrency(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return optionError("WithMaxConcurrency(%d): need at least 1", n)
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
		if l == nil {
			return optionError("WithLogger(nil): use slog.New(slog.DiscardHandler) to discard")
		}
		c.logger = l
		return nil
	}
}
