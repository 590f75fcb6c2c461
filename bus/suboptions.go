package bus

import (
	"fmt"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/optcheck"
)

// This file holds the subscriber options (SubOption) and the overflow
// policies.

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

// A SubOption configures Subscribe. A bad option makes Subscribe return an
// error wrapping a *keysched.OptionError that names it (errors.Is(err,
// keysched.ErrInvalidOption) holds). SubOptions meet by keysched.Option's
// rule, the one rule of every keysched module (see its "How options
// meet"): the last of a name wins; MaxKeyDepth above MaxPending is never
// reached (MaxPending applies first); MaxKeyDepth alone above
// keysched.DefaultMaxPending raises the pending bound to it; MaxConcurrency
// above the bus's workers has no effect (the bus's pool is shared by its
// subscribers and does not grow for one). EjectAfter without Timeout is
// refused.
type SubOption func(*subConfig) error

type subConfig struct {
	maxKeyDepth int // for Block's wait (Publish); keysched.New checks it
	overflow    OverflowPolicy
	failure     keysched.FailurePolicy
	timeout     time.Duration
	ejectAfter  int
	deadLetter  any // func(DeadLetter[K]) for the bus's K
	// sched holds the scheduler options the SubOptions that are the
	// scheduler's own translate to (MaxConcurrency, MaxKeyDepth,
	// MaxPending, Retry, Failure, Timeout, Observe, TaskAges), in the
	// caller's order: keysched.New checks them and applies its rule for
	// how options meet, and Subscribe names a refused one as the SubOption
	// it came from (subOptionOf).
	sched []keysched.Option
}

// subOptionOf names the SubOption a scheduler option came from.
var subOptionOf = map[string]string{
	"WithMaxConcurrency": "MaxConcurrency",
	"WithMaxKeyDepth":    "MaxKeyDepth",
	"WithMaxPending":     "MaxPending",
	"WithRetry":          "Retry",
	"WithFailurePolicy":  "Failure",
	"WithTaskTimeout":    "Timeout",
	"WithObserver":       "Observe",
}

// MaxConcurrency is the subscriber's bulkhead: at most n of its handlers run
// at once, so a slow subscriber cannot take more than n of the bus's workers
// (default: the pool's size). n >= 1.
func MaxConcurrency(n int) SubOption {
	return func(c *subConfig) error {
		c.sched = append(c.sched, keysched.WithMaxConcurrency(n)) // checked by keysched.New
		return nil
	}
}

// MaxKeyDepth bounds, per key, the events this subscriber holds, queued plus
// running (default keysched.DefaultMaxKeyDepth). At the bound its
// OverflowPolicy applies. n >= 1.
func MaxKeyDepth(n int) SubOption {
	return func(c *subConfig) error {
		c.maxKeyDepth = n
		c.sched = append(c.sched, keysched.WithMaxKeyDepth(n)) // checked by keysched.New
		return nil
	}
}

// MaxPending bounds the events this subscriber holds over all keys, queued
// plus running (default keysched.DefaultMaxPending, about 10 MiB of queued
// events): the subscriber's memory bound. At the bound its OverflowPolicy
// applies. n >= 1.
func MaxPending(n int) SubOption {
	return func(c *subConfig) error {
		c.sched = append(c.sched, keysched.WithMaxPending(n)) // checked by keysched.New
		return nil
	}
}

// OnFull sets what Publish does when this subscriber is at a bound (default
// Block). See OverflowPolicy.
func OnFull(p OverflowPolicy) SubOption {
	return func(c *subConfig) error {
		if r := optcheck.OneOf("OnFull", p, "policy", Block, Reject, DropNewest); r != nil {
			return refused(r)
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
		c.sched = append(c.sched, keysched.WithRetry(p)) // checked by keysched.New
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
		c.failure = p
		c.sched = append(c.sched, keysched.WithFailurePolicy(p)) // checked by keysched.New
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
		c.timeout = d
		c.sched = append(c.sched, keysched.WithTaskTimeout(d)) // checked by keysched.New
		return nil
	}
}

// EjectAfter ejects the subscriber after n consecutive timed-out attempts.
// An attempt timed out when its ctx's deadline (Timeout) had passed by the
// time it returned, or when its error wraps context.DeadlineExceeded; any
// other run, a snoozed one (keysched.Snooze) included, resets the count. Once ejected, the subscriber receives
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
		if r := optcheck.AtLeast("EjectAfter", n, 1); r != nil {
			return refused(r)
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
// quick, as the key waits for it. It may publish with DeadLetter.Context
// (which never waits for room: a full Block subscriber refuses at once; with
// another context it should have a deadline, since fn holds a worker). It
// must not call Close, Drain or Unsubscribe with a context other than
// DeadLetter.Context (with it they return keysched.ErrInsideTask): they
// would wait for fn itself. A panic in fn is recovered and logged. Without DeadLetters each such event is logged. K
// must be the bus's key type, or Subscribe fails.
func DeadLetters[K comparable](fn func(DeadLetter[K])) SubOption {
	return func(c *subConfig) error {
		if r := optcheck.NotNil("DeadLetters", fn == nil, "a function"); r != nil {
			return refused(r)
		}
		c.deadLetter = fn
		return nil
	}
}
