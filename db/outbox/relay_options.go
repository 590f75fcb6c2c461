package outbox

import (
	"log/slog"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/optcheck"
	"github.com/keysched/keysched/internal/opterror"
	"github.com/keysched/keysched/internal/schedopt"
)

// Defaults of the relay's options.
const (
	DefaultBatchSize     = 1000
	DefaultKeyBatch      = 100
	DefaultPollInterval  = 200 * time.Millisecond
	DefaultLeaseDuration = 30 * time.Second
	DefaultWorkers       = 64
	// MaxLeaseDuration bounds WithLeaseDuration: the relay's deadlines are
	// nanoseconds on its monotonic clock plus the lease, which must not
	// overflow.
	MaxLeaseDuration = 24 * time.Hour
)

// lingerPolls is how long a relay keeps the lease of a key it found drained
// (nothing pending, nothing in flight), in poll intervals (WithPollInterval),
// at most a third of the lease: see Relay.
const lingerPolls = 10

// minLeaseDuration is WithLeaseDuration's lower bound.
const minLeaseDuration = 30 * time.Millisecond

// DefaultRetry is the relay's retry policy unless WithRetry says otherwise:
// 10 attempts, backoff ceilings from 100 ms doubling to 30 s (full jitter).
var DefaultRetry = keysched.RetryPolicy{MaxAttempts: 10, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 30 * time.Second, Multiplier: 2}

// A RelayOption configures NewRelay. A bad one makes NewRelay fail with a
// *keysched.OptionError naming it (errors.As finds it, as it does every
// keysched module's refused option; errors.Is matches ErrInvalidOption and
// keysched.ErrInvalidOption); a scheduler option's refusal
// (WithSchedulerOptions, or the scheduler refusing a relay option such as
// WithRetry) wraps the scheduler's *keysched.OptionError with
// ErrInvalidOption.
//
// Relay options meet by keysched.Option's rule, the one rule of every
// keysched module (see its "How options meet"):
//   - The last of a name wins (WithSchedulerOptions add up).
//   - Bounds nest, and of two given the outer one applies: WithKeyBatch
//     above WithBatchSize is lowered to it; WithPollInterval above a third
//     of WithLeaseDuration is lowered to that third.
//   - A default gives way to a bound given: WithKeyBatch alone above
//     DefaultBatchSize raises the batch size to it; without
//     WithLeaseDuration, the lease is raised to three times
//     WithPollInterval and to twice WithSinkTimeout when that is more than
//     DefaultLeaseDuration (at most MaxLeaseDuration); without WithWorkers, a
//     keysched.WithMaxConcurrency or keysched.WithPool given with
//     WithSchedulerOptions sizes the pool.
//   - Options that cannot both hold are refused, the *keysched.OptionError
//     naming both (Option and With): WithSinkTimeout above half of
//     WithLeaseDuration (a sink call's context ends with its key's lease,
//     and a call may start with two thirds of the lease left or less, so the
//     timeout would not be reached: every longer call would fail at the
//     lease instead, and be retried); WithTakeOverOnStart without
//     WithOwner; WithWorkers with keysched.WithPool. The sink timeout is
//     not clamped to the lease as nested bounds are: with the lease applying
//     first, a call the caller allowed its full timeout would fail instead.
type RelayOption func(*relayConfig) error

type relayConfig struct {
	retry       keysched.RetryPolicy
	policy      keysched.FailurePolicy
	workers     int
	taskTimeout time.Duration
	batch       int
	keyBatch    int
	maxKeys     int
	poll        time.Duration
	lease       time.Duration
	linger      time.Duration // how long a drained key's lease is kept (lingerPolls polls, at most lease/3)
	retention   time.Duration
	listen      bool
	logger      *slog.Logger
	owner       string
	onDead      func(DeadEvent)
	takeOver    bool
	schedOpts   []keysched.Option
	markHook    MarkHook
	// given, for how options meet (see NewRelay)
	workersSet, batchSet, pollSet, leaseSet bool
	maxOutage                               time.Duration
}

// refused is the *keysched.OptionError of r (nil for nil), with
// ErrInvalidOption for Sentinel: the refusal of an option of New or
// NewRelay.
func refused(r *optcheck.Refusal) error { return opterror.New(ErrInvalidOption, r) }

// newRelayConfig applies opts to the defaults, then makes them meet by the
// rule RelayOption states (keysched.Option's).
func newRelayConfig(opts []RelayOption) (relayConfig, error) {
	c := relayConfig{
		retry:   DefaultRetry,
		workers: DefaultWorkers,
		batch:   DefaultBatchSize,
		poll:    DefaultPollInterval,
		lease:   DefaultLeaseDuration,
		listen:  true,
		logger:  slog.Default(),
	}
	for i, opt := range opts {
		if opt == nil {
			return c, refused(optcheck.NilOption(i, "RelayOption"))
		}
		if err := opt(&c); err != nil {
			return c, err
		}
	}
	// Bounds nest: the key batch within the batch.
	if c.keyBatch == 0 {
		c.keyBatch = DefaultKeyBatch
	} else if !c.batchSet {
		c.batch = max(c.batch, c.keyBatch) // the default gives way
	}
	c.keyBatch = min(c.keyBatch, c.batch)
	if c.maxKeys == 0 {
		c.maxKeys = c.batch
	}
	// The poll interval and the sink timeout within the lease: a default
	// lease gives way to them (at most MaxLeaseDuration).
	if !c.leaseSet {
		if c.pollSet {
			c.lease = atLeast(c.lease, c.poll, 3)
		}
		c.lease = atLeast(c.lease, c.taskTimeout, 2)
	}
	c.poll = min(c.poll, c.lease/3)
	c.linger = min(lingerPolls*c.poll, c.lease/3)
	if c.taskTimeout > c.lease/2 {
		if !c.leaseSet {
			return c, refused(optcheck.Refuse("WithSinkTimeout", c.taskTimeout,
				"above half of MaxLeaseDuration (%v): the lease must be at least twice the sink timeout", MaxLeaseDuration))
		}
		r := optcheck.Refuse("WithSinkTimeout", c.taskTimeout,
			"above half of WithLeaseDuration(%v): a sink call's context ends with its key's lease, and a call may start "+
				"with two thirds of the lease left or less (it is renewed every third), so the timeout would not be reached", c.lease)
		r.With = "WithLeaseDuration"
		return c, refused(r)
	}
	if c.takeOver && c.owner == "" {
		return c, refused(optcheck.Conflict("WithTakeOverOnStart", "WithOwner",
			"needs WithOwner: a random name has no predecessor"))
	}
	return c, nil
}

// atLeast is lease raised to k times d if that is more, at most
// MaxLeaseDuration.
func atLeast(lease, d time.Duration, k time.Duration) time.Duration {
	if d > MaxLeaseDuration/k {
		return MaxLeaseDuration
	}
	return min(max(lease, k*d), MaxLeaseDuration)
}

// WithRetry sets the retry policy of a failing sink call (default
// DefaultRetry). A RetryPolicy with MaxAttempts 1 never retries. See
// keysched.RetryPolicy. A panicking sink is retried like a failing one.
func WithRetry(p keysched.RetryPolicy) RelayOption {
	return func(c *relayConfig) error { c.retry = p; return nil }
}

// WithFailurePolicy says what a key does once one of its rows failed for
// good and was marked dead: keysched.Continue (the default) goes on with the
// key's next row; keysched.Park stops the key, in the database, for every
// relay, until Resume or Skip (the other keys go on).
//
// The relay implements Park itself, in the database, rather than with the
// scheduler's in-memory park: a parked key must stay parked when its relay
// stops or dies, and must be seen by every relay.
func WithFailurePolicy(p keysched.FailurePolicy) RelayOption {
	return func(c *relayConfig) error {
		if r := optcheck.OneOf("WithFailurePolicy", p, "policy", keysched.Continue, keysched.Park); r != nil {
			return refused(r)
		}
		c.policy = p
		return nil
	}
}

// WithWorkers sets how many sink calls run at once, over all keys (the size
// of the relay scheduler's pool; default DefaultWorkers). n >= 1.
func WithWorkers(n int) RelayOption {
	return func(c *relayConfig) error {
		if r := optcheck.Workers("WithWorkers", n); r != nil {
			return refused(r)
		}
		c.workers, c.workersSet = n, true
		return nil
	}
}

// WithSinkTimeout bounds each sink call (d > 0); a call that overruns is a
// failed, retried attempt. Default: bounded only by the key's lease. At most
// half the lease: above half of WithLeaseDuration NewRelay fails (see
// RelayOption); without WithLeaseDuration the lease is raised to 2d if that
// is longer, and d above half of MaxLeaseDuration is refused. A
// keysched.WithTaskTimeout given with WithSchedulerOptions replaces it and
// is not checked against the lease: use WithSinkTimeout.
func WithSinkTimeout(d time.Duration) RelayOption {
	return func(c *relayConfig) error {
		if r := optcheck.Positive("WithSinkTimeout", d); r != nil {
			return refused(r)
		}
		c.taskTimeout = d
		return nil
	}
}

// WithBatchSize bounds the rows the relay holds in flight (fetched and not
// yet settled: queued, being published, or published and not yet marked), and
// so the rows it reads per poll (default DefaultBatchSize). n >= 1.
func WithBatchSize(n int) RelayOption {
	return func(c *relayConfig) error {
		if r := optcheck.AtLeast("WithBatchSize", n, 1); r != nil {
			return refused(r)
		}
		c.batch, c.batchSet = n, true
		return nil
	}
}

// WithKeyBatch bounds the rows of one key the relay holds in flight (default
// DefaultKeyBatch, capped at the batch size; given alone above
// DefaultBatchSize it raises the batch size to n: see RelayOption). A key whose sink fails or is
// slow holds at most this many of the batch's slots, so the other keys keep
// flowing. n >= 1.
func WithKeyBatch(n int) RelayOption {
	return func(c *relayConfig) error {
		if r := optcheck.AtLeast("WithKeyBatch", n, 1); r != nil {
			return refused(r)
		}
		c.keyBatch = n
		return nil
	}
}

// WithMaxKeys bounds how many keys the relay leases at once (default: the
// batch size). A relay at the bound gives the slot of a key that lingers
// (drained, nothing in flight: see Relay) to a key with pending rows that
// waits. n >= 1.
func WithMaxKeys(n int) RelayOption {
	return func(c *relayConfig) error {
		if r := optcheck.AtLeast("WithMaxKeys", n, 1); r != nil {
			return refused(r)
		}
		c.maxKeys = n
		return nil
	}
}

// WithPollInterval sets how long the relay waits between polls when it
// found nothing to do (default DefaultPollInterval; capped at a third of
// WithLeaseDuration; given alone above a third of DefaultLeaseDuration it
// raises the lease to 3d: see RelayOption). On PostgreSQL a NOTIFY from a committed Write wakes an idle
// relay sooner (see WithListen and WithNotify); a relay that found rows is
// busy, is not notified, and polls again once its rows have settled (10 ms
// after its last poll began at the soonest, or d if shorter), and in any
// case 25 ms after that poll (or d if shorter); a relay that found rows
// less than 25 ms before is still busy (it looks again then), and a poll
// finding nothing after that makes it idle (writers notify it). A write racing a relay's
// going idle waits up to d. A full batch is followed by the next poll at
// once. A drained key's lease is kept for ten poll intervals (at most a
// third of the lease: see Relay).
// d > 0.
func WithPollInterval(d time.Duration) RelayOption {
	return func(c *relayConfig) error {
		if r := optcheck.Positive("WithPollInterval", d); r != nil {
			return refused(r)
		}
		c.poll, c.pollSet = d, true
		return nil
	}
}

// WithLeaseDuration sets how long a relay's claim on a key lasts without
// renewal (default DefaultLeaseDuration, raised by WithPollInterval and
// WithSinkTimeout given without it; at least 30 ms, at most
// MaxLeaseDuration). The database counts it from when the claim or renewal
// ran, after any wait for a lock, by its own clock; the relay, locally, from
// before it sent the statement (see Relay). The relay renews its leases
// every third of it. When a relay dies, its keys are taken over by another
// relay after at most this long. Choose it well above your sink's longest
// call and your database's longest stall: at least twice WithSinkTimeout, or
// NewRelay fails (see RelayOption). A claim that takes a third of the lease
// or more, or a row whose lease ends before its sink call starts, is counted
// (RelayStats.SlowClaims, LapsedBeforeSink) and logged at Warn (each at most
// once a minute): a relay whose database round trips take longer than the
// lease publishes nothing, and these say so.
func WithLeaseDuration(d time.Duration) RelayOption {
	return func(c *relayConfig) error {
		if r := optcheck.Within("WithLeaseDuration", d, minLeaseDuration, MaxLeaseDuration); r != nil {
			return refused(r)
		}
		c.lease, c.leaseSet = d, true
		return nil
	}
}

// WithRetention keeps sent rows (state Sent, with their send time) for d
// before the relay deletes them, for audit or replay; d == 0 (the default)
// deletes a row as soon as it is marked sent. d >= 0.
func WithRetention(d time.Duration) RelayOption {
	return func(c *relayConfig) error {
		if r := optcheck.NotNegative("WithRetention", d); r != nil {
			return refused(r)
		}
		c.retention = d
		return nil
	}
}

// WithListen turns PostgreSQL LISTEN/NOTIFY wake-ups on or off (default on;
// no effect on SQLite). When on, the relay holds one connection of the
// *sql.DB for as long as it runs: size the pool for it; while the relay is
// idle and listening it keeps a row in <table>_idle, which makes writers
// notify (see WithNotify). An Outbox made with
// WithNotify(false) has no trigger to notify it: its relays poll only and
// hold no LISTEN connection, whatever WithListen says.
func WithListen(on bool) RelayOption {
	return func(c *relayConfig) error { c.listen = on; return nil }
}

// WithLogger sets where the relay logs (default slog.Default()): database
// errors (one line per change of state), lost leases, dead rows, and the
// warnings that its lease is short for the database (see
// WithLeaseDuration). nil is an error.
func WithLogger(l *slog.Logger) RelayOption {
	return func(c *relayConfig) error {
		if r := optcheck.Logger("WithLogger", l); r != nil {
			return refused(r)
		}
		c.logger = l
		return nil
	}
}

// WithOwner names the relay in the lease table's owner column (default a
// random UUID), for operators and logs: which service instance holds which
// key. 1 to 256 bytes.
//
// The name is not what makes a lease a relay's: each Relay also gets a
// fencing token (Token, a random UUID per NewRelay) stored with the name in
// every lease row it takes, and claims, renewals, marks (sent or dead) and
// releases all require both (and renewals, marks, releases and fetches the
// epoch of the claim they belong to: see ClaimFrom). So relays sharing a
// name are safe: two replicas configured alike, or a restart or rolling
// deploy while the old process still runs each hold their own keys, and a
// key is published by one of them at a time, in order. A relay whose lease was taken (after it expired)
// finds out at its next renewal or mark (0 rows), cancels the key's sink
// call in flight, gives its rows back unmarked (they stay pending for the
// new holder, which publishes them again: duplicates, never a loss) and
// never touches the new holder's lease.
//
// The price: a relay restarted under the same name gets no head start. A
// live lease of another token is never taken, whatever its name, because a
// process that still holds it may still be publishing; a crashed relay's
// keys wait until their leases expire (WithLeaseDuration), as they would for
// a relay of another name. Close releases a relay's leases, so a graceful
// restart hands the keys over at once. A deployment that runs at most one
// process per name can have the fast restart after a crash back with
// WithTakeOverOnStart.
//
// A relay of a version before the token, still running under the same name,
// is not fenced: it takes the leases of its name (it ignores the token) and
// renews them, and both publish the key. Stop the older relays before
// starting new ones under their names (relays of different names are safe
// across versions).
func WithOwner(name string) RelayOption {
	return func(c *relayConfig) error {
		if r := optcheck.Text("WithOwner", name, 256); r != nil {
			return refused(r)
		}
		c.owner = name
		return nil
	}
}

// WithTakeOverOnStart makes Run start by releasing the leases held under
// this relay's WithOwner name by other relays (other tokens), so that the
// keys of a crashed predecessor of that name are claimed at once instead of
// when their leases expire. It needs WithOwner (NewRelay fails without it,
// the *keysched.OptionError naming both).
//
// Use it only where at most one process runs under the name (say, one
// process per SQLite file, restarted by a supervisor): if the predecessor is
// in fact still running, it is fenced out (its next renewal or mark finds
// its leases gone: it cancels its sink calls in flight, marks nothing more
// and stops publishing those keys), but only then: until its first mark
// or renewal after Run's start finds a lease gone, it goes on publishing
// that key's rows it had fetched (a fast sink can send all of them before
// the first mark returns: 19 of 20 rows in a probe), concurrently with the
// new relay's calls on the same key. Per-key order is not guaranteed in that
// window (each relay's stream is in order, their interleaving is not).
// Without this option, relays sharing a name are as safe as relays with
// different names (see WithOwner).
func WithTakeOverOnStart() RelayOption {
	return func(c *relayConfig) error { c.takeOver = true; return nil }
}

// WithMaxOutage makes Run give up when the database stays away: once every
// poll has failed for d (no poll whose database calls all succeeded), Run
// shuts down as it does when its context ends and returns an error wrapping
// ErrDatabaseUnavailable with the number of failed calls and the last error.
// d > 0. By default (without this option) Run never gives up on the
// database: it retries every poll interval through a restart or a failover,
// however long, logging one line when the calls start failing, one when they
// have failed 10, 100, 1000... times in a row, and one when they succeed
// again (see the package doc's "Database faults").
//
// A relay running in a process that a supervisor restarts, or whose health
// check should fail when it cannot publish, may prefer a bound: a minute or
// a few, above the database's longest failover.
func WithMaxOutage(d time.Duration) RelayOption {
	return func(c *relayConfig) error {
		if r := optcheck.Positive("WithMaxOutage", d); r != nil {
			return refused(r)
		}
		c.maxOutage = d
		return nil
	}
}

// WithOnDead sets a function called after a row was marked dead, with the
// row (for alerting). It runs on the worker, while the key waits: keep it
// short. A panic in fn is recovered and logged; the row stays dead and the
// key goes on.
func WithOnDead(fn func(DeadEvent)) RelayOption {
	return func(c *relayConfig) error {
		if r := optcheck.NotNil("WithOnDead", fn == nil, "a function"); r != nil {
			return refused(r)
		}
		c.onDead = fn
		return nil
	}
}

// WithSchedulerOptions passes options to the relay's keysched scheduler: an
// observer (keysched.WithObserver, e.g. otelkeysched's Metrics.Observer, for
// the queue wait and attempt duration histograms), keysched.WithTaskAges
// (for Scheduler().OldestAge), keysched.WithMaxConcurrency, and so on.
// Several WithSchedulerOptions add up; a nil keysched.Option is an error.
//
// They are applied after the settings that the relay's own options make
// (WithWorkers, WithRetry, WithSinkTimeout, WithLogger), so the same setting
// given here overrides those: keysched.WithWorkers(8) here means 8 workers.
// keysched.WithPool cannot be combined with the relay's WithWorkers: NewRelay
// fails (without WithWorkers it replaces the default pool) (use it with care: a pool shared with other work delays the sink
// calls, and so the leases' use).
//
// The settings the relay's correctness rests on are the relay's own: an
// option here that makes one of them is refused (NewRelay fails with a
// *keysched.OptionError for WithSchedulerOptions, its With naming the
// keysched option, its text the relay option to use instead), where it
// would be overridden without a word:
//   - keysched.WithDeadLetter: the relay's dead letter marks the row dead in
//     the database; another function would leave it unmarked, to be
//     published again by the next tenure. Use WithOnDead.
//   - keysched.WithFailurePolicy: always Continue in the scheduler; the relay
//     parks keys in the database, where every relay sees the park and it
//     outlives a restart. Use the relay's WithFailurePolicy.
//   - keysched.WithMaxPending and keysched.WithMaxKeyDepth: the relay's batch
//     size bounds what it submits, so its poll loop never waits for room in
//     its own scheduler while holding leases. Use WithBatchSize and
//     WithKeyBatch.
//
// keysched.WithRetryPanics is accepted and changes nothing: the relay sets
// it too (a panicking sink is retried like a failing one, as the Sink
// contract says).
func WithSchedulerOptions(opts ...keysched.Option) RelayOption {
	return func(c *relayConfig) error {
		for i, o := range opts {
			if o == nil {
				return refused(optcheck.Refuse("WithSchedulerOptions", nil, "option %d is nil", i))
			}
			for _, name := range schedopt.Settings(o) {
				if instead, own := relayOwnedSchedulerOptions[name]; own {
					return refused(optcheck.Conflict("WithSchedulerOptions", "keysched."+name,
						"option %d is keysched.%s, which the relay sets itself; use %s", i, name, instead))
				}
			}
		}
		c.schedOpts = append(c.schedOpts, opts...)
		return nil
	}
}

// relayOwnedSchedulerOptions maps each keysched option that the relay sets
// itself to the relay option to use instead (see WithSchedulerOptions).
var relayOwnedSchedulerOptions = map[string]string{
	"WithDeadLetter":    "WithOnDead",
	"WithFailurePolicy": "the relay's WithFailurePolicy",
	"WithMaxPending":    "WithBatchSize",
	"WithMaxKeyDepth":   "WithBatchSize and WithKeyBatch",
}
