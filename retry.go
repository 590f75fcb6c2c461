package keysched

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/keysched/keysched/internal/durations"
	"github.com/keysched/keysched/internal/optcheck"
)

// RetryPolicy makes delivery at-least-once: a failed attempt is retried, with
// exponential backoff and full jitter, up to MaxAttempts attempts in total;
// then the task is dead-lettered. A handler can therefore run more than once
// for one task: it must be idempotent.
//
// The delay before attempt n (n >= 2) is uniformly random in
// [0, min(MaxBackoff, InitialBackoff * Multiplier^(n-2))]: "full jitter", as
// described in the AWS Architecture Blog's "Exponential Backoff and Jitter"
// (2015), so that keys failing together do not retry in lockstep. The
// arithmetic saturates for every accepted policy: a ceiling beyond
// math.MaxInt64 ns (about 292 years) is math.MaxInt64 ns, never a wrapped,
// negative or zero delay; a Multiplier that is NaN, infinite or below 1 is
// refused with ErrInvalidOption.
//
// While a task waits out its delay, its key's later tasks wait too (order
// holds), but the wait holds no worker and no goroutine: a timer hands the
// key back to the pool.
type RetryPolicy struct {
	MaxAttempts    int           // attempts in total, the first included; 0 or 1: never retry
	InitialBackoff time.Duration // ceiling of the delay before the second attempt; > 0 when MaxAttempts > 1
	MaxBackoff     time.Duration // cap on any one delay; 0 means max(InitialBackoff, 1 minute)
	Multiplier     float64       // growth of the ceiling per attempt, >= 1; 0 means 2
}

func (p RetryPolicy) validate() error {
	switch {
	case p.MaxAttempts < 0:
		return optionError("WithRetry", nil, "RetryPolicy.MaxAttempts %d < 0", p.MaxAttempts)
	case p.InitialBackoff < 0 || p.MaxBackoff < 0:
		return optionError("WithRetry", nil, "RetryPolicy backoffs must not be negative (%v, %v)", p.InitialBackoff, p.MaxBackoff)
	case p.MaxAttempts > 1 && p.InitialBackoff == 0:
		return optionError("WithRetry", nil, "RetryPolicy.InitialBackoff must be > 0 when retrying")
	case p.MaxBackoff > 0 && p.MaxBackoff < p.InitialBackoff:
		return optionError("WithRetry", nil, "RetryPolicy.MaxBackoff %v < InitialBackoff %v", p.MaxBackoff, p.InitialBackoff)
	case p.Multiplier != 0 && (p.Multiplier < 1 || math.IsNaN(p.Multiplier) || math.IsInf(p.Multiplier, 0)):
		return optionError("WithRetry", nil, "RetryPolicy.Multiplier %v: need >= 1 (or 0 for 2)", p.Multiplier)
	}
	return nil
}

// ceiling is the upper end of the jitter window before attempt n (n >= 2).
// It saturates (durations.Scale): for every policy validate accepts, it is
// in [0, the cap], math.MaxInt64 ns included, never wrapped negative.
func (p RetryPolicy) ceiling(n int) time.Duration {
	m := p.Multiplier
	if m == 0 {
		m = 2
	}
	limit := p.MaxBackoff
	if limit == 0 {
		limit = max(p.InitialBackoff, time.Minute)
	}
	return min(durations.Scale(p.InitialBackoff, math.Pow(m, float64(n-2))), limit)
}

// delay draws the full-jitter delay before attempt n (n >= 2): uniform on
// [0, ceiling(n)], ceiling(n) == math.MaxInt64 included (drawn as a uint64,
// so that the bound + 1 cannot overflow).
func (p RetryPolicy) delay(n int) time.Duration {
	c := p.ceiling(n)
	if c <= 0 {
		return 0
	}
	return time.Duration(rand.Uint64N(uint64(c) + 1))
}

// WithRetry sets the retry policy (default: none, one attempt: at-most-once
// execution). See RetryPolicy. Errors made with Snooze are not attempts: they
// run again later without spending the budget. Errors made with Permanent, panics (unless
// WithRetryPanics) and attempts whose context was cancelled (Completion.Cancel,
// Close's context ending) are never retried. A timed-out attempt
// (WithTaskTimeout) is.
func WithRetry(p RetryPolicy) Option {
	return func(c *config) error {
		if err := p.validate(); err != nil {
			return err
		}
		c.retry, c.retrySet = p, true
		return nil
	}
}

// snoozeError marks a run that did not really start its work (see Snooze).
type snoozeError struct {
	err   error
	after time.Duration
}

func (z *snoozeError) Error() string { return z.err.Error() }
func (z *snoozeError) Unwrap() error { return z.err }

// Snooze wraps err, returned by a task, to say that this run did not really
// start its work (a local refusal: a bulkhead full, a circuit breaker open,
// a rate limiter saying wait, a lock held elsewhere) and should simply run
// again later. The name and the semantics follow River's JobSnooze (and
// exq's snooze): a snoozed run is not an attempt.
//
// err must not be nil: Snooze(nil, after) is nil, for any after (zero and
// negative included), so a task returning it succeeded and does not run
// again, as with Permanent(nil). To run again with nothing to report, give a
// reason (an error of your own saying what refused the run).
//
//   - It is not counted: it spends nothing of RetryPolicy.MaxAttempts, is
//     not listed in DeadLetter.Errors nor counted in DeadLetter.Attempts,
//     and Attempt(ctx) gives the next run the same number. A normal failure
//     after any number of snoozes still has its whole budget. Stats.Snoozed
//     counts snoozed runs (Stats.Retried does not).
//   - It is honoured with or without a retry policy (at-most-once execution
//     concerns attempts; a snoozed run is none).
//   - When: exactly after (no jitter: after is a "not before", like HTTP's
//     Retry-After or a rate limiter's reservation; add jitter to it yourself
//     when many keys are refused at once). after <= 0 means the retry
//     policy's first delay, full jitter on [0, RetryPolicy.InitialBackoff];
//     without a retry policy, 1 ms.
//   - While it waits, the task holds its key as a retry backoff does: the
//     key's later tasks wait behind it (order holds), no worker and no
//     goroutine are held, Completion.Cancel withdraws it (context.Canceled)
//     and Close's abort completes it with ErrAborted. WithTaskTimeout
//     applies to every run, snoozed or not.
//   - It loses to everything that ends a task: Permanent anywhere in the
//     error's chain wins (the task fails now); a panic is a panic; a run
//     whose context was cancelled (Cancel, Close's abort) is not snoozed but
//     ends the task with its error, counted as its last attempt.
//   - The Observer's AttemptStarted and AttemptEnded see every run, snoozed
//     ones too (AttemptEnded's Err is the Snooze error: test it with
//     IsSnoozed); the run after a snooze has the same AttemptInfo.N.
//
// There is no cap on consecutive snoozes: a task that snoozes for ever holds
// its key for ever (until Cancel or Close). Bounding it is the caller's
// responsibility, because only the caller knows how long a refusal can be
// legitimately temporary: a circuit breaker half-opens and lets one counted
// call through, a bulkhead frees as the calls in flight end (each bounded by
// its timeout), a token bucket refills. A core cap that turned snoozes into
// counted failures would park a healthy key after a long busy spell, the
// very thing Snooze exists to avoid.
//
// errors.Is and errors.As see err through the wrapper. When several Snoozes
// are nested, the outermost one's delay is used (the first errors.As finds).
// Snooze(nil, d) is nil for every d (the task succeeded), as Permanent(nil) is.
func Snooze(err error, after time.Duration) error {
	if err == nil {
		return nil
	}
	return &snoozeError{err: err, after: after}
}

// IsSnoozed reports whether err, or any error it wraps, was made by Snooze.
func IsSnoozed(err error) bool {
	var z *snoozeError
	return errors.As(err, &z)
}

// minSnooze is a snooze's delay for after <= 0 without a retry backoff: not
// zero, so that a task snoozing in a loop cannot spin a worker.
const minSnooze = time.Millisecond

// snoozeDelay is the wait before a snoozed task runs again (see Snooze).
func (p RetryPolicy) snoozeDelay(after time.Duration) time.Duration {
	if after > 0 {
		return after
	}
	if p.InitialBackoff <= 0 {
		return minSnooze
	}
	return p.delay(2)
}

// WithRetryPanics makes a panicking attempt count as a retryable failure
// instead of going straight to the dead letter.
func WithRetryPanics() Option {
	return func(c *config) error { c.retryPanics = true; return nil }
}

// WithTaskTimeout gives each attempt's context a deadline d after the attempt
// starts; an attempt that overruns sees ctx.Err() == context.DeadlineExceeded
// and, if it returns an error, counts as a failed (and retryable) attempt.
// A task that ignores its context cannot be stopped: it keeps its worker and
// its key until it returns. d > 0.
func WithTaskTimeout(d time.Duration) Option {
	return func(c *config) error {
		if r := optcheck.Positive("WithTaskTimeout", d); r != nil {
			return refused(r)
		}
		c.taskTimeout = d
		return nil
	}
}

// A DeadLetter describes a task that failed for good: its attempts ran out,
// its error was Permanent, it panicked, its running attempt was cancelled, or
// Close's context ended before it ran (then Attempts may be 0 and Err is
// ErrAborted) or before it ran again (parked, or waiting out a backoff or a
// Snooze: Err matches ErrAborted and says the task ran; Errors holds its
// attempts' errors).
type DeadLetter[K comparable] struct {
	Key      K
	Task     Task  // the original work, so it can be replayed on purpose
	Attempts int   // attempts made, since the last Resume for a parked key (Errors keeps them all); snoozed runs are not attempts
	Err      error // the last attempt's error
	// Errors holds every attempt's error, oldest first (Err is the last).
	// Snoozed runs (see Snooze) are not listed.
	Errors []error
	// FirstAttempt and LastAttempt are when the first and the last failed
	// attempts ended (zero for a task that never ran).
	FirstAttempt, LastAttempt time.Time
	// Context carries the values of the context the task was submitted
	// with. It is never cancelled, and it counts as a task's context: a
	// Submit made with it never waits for room (it fails with ErrKeyFull or
	// ErrFull instead). Use it to re-enqueue from the dead-letter function:
	// the failed task still holds its key's slot while the function runs,
	// so waiting for room on that key would wait for itself.
	Context context.Context
}

// WithDeadLetter sets the function that receives every task that failed for
// good. It is called once per such task (once per Park, for a parked key,
// and once more with ErrAborted if Close gives up on a parked task), with no
// scheduler lock held, while the worker that ran the last attempt waits for
// it: it should be quick, as the key waits too. While it runs it counts in
// Stats.Pending, and Drain and Close wait for it. It may submit to the
// scheduler with DeadLetter.Context (which never waits for room). A task's
// Completion is done only once its dead letter was delivered (fn returned),
// on every path: a failure under Continue, Park then Skip, Resume or Cancel,
// Close's abort. Code that commits an offset or acknowledges a message when
// a Completion is done can rely on it. Under the Park policy the
// key is already parked when fn is called, so fn may Resume or Skip it. A
// panic in fn, or a runtime.Goexit, is recovered and logged. fn must not
// call Drain or Close with a context other than DeadLetter.Context: they
// would wait for the task fn is reporting (with it they fail with
// ErrInsideTask). The dead letters of the tasks Close gives up on are
// delivered concurrently across keys, but each key's one at a time and in
// the key's order, after the letter of the task that was running on the key
// (see Close), so fn may be called from several goroutines at once, never
// for two letters of one key at once.
// Without it, each such task is logged (log/slog, WithLogger) at Warn with
// its key, attempts and error, except the tasks Close gave up on before they
// ran: those are logged at Debug only (a shutdown with a backlog would
// otherwise log one line per task) and counted by CloseError.NotRun.
// K must be the scheduler's key type, or New fails.
func WithDeadLetter[K comparable](fn func(DeadLetter[K])) Option {
	return func(c *config) error {
		if r := optcheck.NotNil("WithDeadLetter", fn == nil, "a function"); r != nil {
			return refused(r)
		}
		c.deadLetter = fn
		return nil
	}
}

// FailurePolicy says what a key does after one of its tasks failed for good.
type FailurePolicy int

const (
	// Continue moves the key on to its next task (the default). The failed
	// task counts as failed (or panicked) and is dead-lettered.
	Continue FailurePolicy = iota
	// Park stops the key: the failed task is dead-lettered but stays at the
	// head of its key, unfinished; the key's later tasks queue behind it
	// (within its depth bound); Parked lists the key, and only Resume (run
	// the head again) or Skip (give it up as failed) moves it. Other keys are
	// not affected. Drain waits for parked keys too.
	Park
)

func (p FailurePolicy) String() string {
	switch p {
	case Continue:
		return "Continue"
	case Park:
		return "Park"
	}
	return fmt.Sprintf("FailurePolicy(%d)", int(p))
}

// WithFailurePolicy sets what a key does after a task failed for good
// (default Continue).
func WithFailurePolicy(p FailurePolicy) Option {
	return func(c *config) error {
		if r := optcheck.OneOf("WithFailurePolicy", p, "policy", Continue, Park); r != nil {
			return refused(r)
		}
		c.failure = p
		return nil
	}
}

// failureRecord is made on a task's first failed attempt.
type failureRecord struct {
	errs        []error
	first, last time.Time
	base        int      // attempts made before the last Resume
	wait        *backoff // the current retry wait (see wait); written before state stWaiting
}

// record adds a failed attempt's error.
func (r *failureRecord) record(err error) {
	now := time.Now()
	if r.errs == nil {
		r.first = now
	}
	r.last = now
	r.errs = append(r.errs, err)
}

// parkedKeys holds the parked head of each parked key.
type parkedKeys[K comparable] struct {
	mu sync.Mutex
	m  map[K]*node[K]
}

// Parked returns the keys now parked (FailurePolicy Park), in no order.
func (s *Scheduler[K]) Parked() []K {
	if s.zero() {
		return nil
	}
	s.parked.mu.Lock()
	defer s.parked.mu.Unlock()
	keys := make([]K, 0, len(s.parked.m))
	for k := range s.parked.m {
		keys = append(keys, k)
	}
	return keys
}

// Resume runs a parked key's head task again, with a fresh attempt budget;
// if it then succeeds the key goes on. It returns ErrNotParked when the key is
// not parked (or a concurrent Cancel took its head), ErrClosed once Close has
// given up on unfinished tasks or has returned (a closed scheduler has no
// parked key), ErrInvalidKey for an unusable key, ErrZeroScheduler for a
// Scheduler not made by New. While a Close is still waiting, Resume and Skip
// work as before: that is how a parked key lets a clean Close finish.
func (s *Scheduler[K]) Resume(key K) error {
	n, err := s.unpark(key)
	if err != nil {
		return err
	}
	c := &n.Completion
	if s.core.aborting.Load() {
		// Close has given up: the task is aborted, not resumed (its walk
		// may not have reached it yet).
		s.abortNode(n)
		return ErrClosed
	}
	// Own the task before touching it: Cancel and Close's abort take parked
	// tasks by the same CompareAndSwap.
	if !c.state.CompareAndSwap(stParked, stRunning) {
		return s.notParked()
	}
	x := c.more.Load() // made when the task first failed
	x.fail.base = int(x.attempts.Load())
	c.state.Store(stQueued)
	// A Cancel or abort that saw it owned here only set its flag.
	if out, stop := s.stopped(c); stop && c.state.CompareAndSwap(stQueued, stFinishing) {
		if out == outCancelled {
			s.core.finish(c, out, context.Canceled)
			s.requeue(n)
			return nil
		}
		// Its dead letter goes to its key's lane once a runner passes it
		// (keepAborted), before those of the tasks behind it.
		s.keepAborted(n, true) // parked until just now
		s.core.notRun.Add(1)
		s.requeue(n)
		s.core.publish(c)
		return ErrClosed
	}
	s.requeue(n) // runs it, or moves the key past it
	return nil
}

// Skip gives up a parked key's head task (its outcome: failed, or panicked,
// with its last error; it was dead-lettered when it parked) and moves the key
// on to its next task. It returns ErrNotParked when the key is not parked,
// ErrClosed once Close has given up on unfinished tasks or has returned,
// ErrInvalidKey and ErrZeroScheduler as Resume does.
func (s *Scheduler[K]) Skip(key K) error {
	n, err := s.unpark(key)
	if err != nil {
		return err
	}
	c := &n.Completion
	if s.core.aborting.Load() {
		s.abortNode(n) // Close has given up: aborted, not skipped
		return ErrClosed
	}
	if !c.state.CompareAndSwap(stParked, stFinishing) {
		return s.notParked()
	}
	errs := c.more.Load().fail.errs
	last := errs[len(errs)-1]
	out := outFailed
	// The runner records a recovered panic as a bare *PanicError; a task's
	// own error that wraps one is a failure, not a panic.
	if _, panicked := last.(*PanicError); panicked { //nolint:errorlint // see above
		out = outPanicked
	}
	s.core.finish(c, out, last)
	s.requeue(n) // a runner skips the finished head and moves the key on
	return nil
}

func (s *Scheduler[K]) notParked() error {
	if s.core.aborting.Load() {
		return ErrClosed
	}
	select {
	case <-s.closed: // Close returned: no key can park any more
		return ErrClosed
	default:
	}
	return ErrNotParked
}

func (s *Scheduler[K]) unpark(key K) (*node[K], error) {
	if s.zero() {
		return nil, ErrZeroScheduler
	}
	if s.keyCheck && !validKey(key) {
		return nil, invalidKey(key)
	}
	s.parked.mu.Lock()
	n, ok := s.parked.m[key]
	if ok {
		delete(s.parked.m, key)
	}
	s.parked.mu.Unlock()
	if !ok {
		return nil, s.notParked()
	}
	return n, nil
}

// park stops n's key with n at its head.
func (s *Scheduler[K]) park(n *node[K]) {
	s.parked.mu.Lock()
	// State and map change together, so Cancel (which may take the node the
	// moment its state says parked) finds it in the map when it removes it.
	n.state.Store(stParked)
	s.parked.m[n.key] = n
	s.parked.mu.Unlock()
}

func (s *Scheduler[K]) dropParked(n *node[K]) {
	s.parked.mu.Lock()
	if s.parked.m[n.key] == n {
		delete(s.parked.m, n.key)
	}
	s.parked.mu.Unlock()
}

func (s *Scheduler[K]) parkedCount() int {
	s.parked.mu.Lock()
	defer s.parked.mu.Unlock()
	return len(s.parked.m)
}
