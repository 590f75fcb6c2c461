package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/sqldb"
)

// A Sink publishes one event: to a broker, a bus, an HTTP endpoint. It
// returns nil once the event is published (durably, for a broker); an error
// makes the relay retry it with its retry policy, then mark the row dead.
// Wrap an error with keysched.Permanent to give up at once, or with
// keysched.Snooze to try again later without spending an attempt (the sink
// refused locally: a full bulkhead, an open breaker, a rate limit; it still
// counts in RelayStats.SinkErrors).
//
// The relay calls a Sink for one key at a time, in the key's write order,
// and for different keys concurrently: a Sink must be safe for concurrent
// use. ctx ends when the relay's lease on the key ends (see the package doc)
// or when the relay shuts down: a Sink must return promptly then, and a
// publish still in flight after that may reach the broker after another relay
// has taken the key over (ClaimFrom(ctx) gives the call's claim epoch, a
// fencing token for the downstream). The same event can be published more
// than once (at-least-once): consumers deduplicate on Event.ID (see package
// inbox).
type Sink func(ctx context.Context, e Event) error

// A Claim is the claim under which a sink call publishes a row: the row's
// key, the relay's name (WithOwner) and fencing token (Relay.Token), and
// the claim's epoch. See ClaimFrom.
type Claim struct {
	Key   string
	Owner string
	Token string
	// Epoch is the claim's epoch: every claim of a key (a relay taking a
	// free key, or an expired lease over) takes a new one, greater than any
	// earlier claim's of the key (one counter per outbox, never reset, so
	// epochs are also unique across keys). It is >= 1.
	Epoch int64
}

type claimKey struct{}

// ClaimFrom returns the claim of the sink call whose context is ctx, and
// whether ctx is one (ok is false for any other context, nil included).
//
// The epoch is a fencing token for downstreams: a relay that pauses past its
// lease (a GC pause, a VM migration, SIGSTOP) may resume in the middle of a
// sink call that then lands after another relay took the key over, whatever
// the relay does, since the call is already on its way. A downstream that
// stores each key's highest epoch with its write (a Kafka transactional ID
// derived from it, a row version column, an HTTP header such as
// "Fencing-Epoch" checked by the receiver) and refuses a write of a lower
// epoch for that key turns such a late write into a refusal. Compare epochs
// of one key only; within one claim, its rows arrive in order, and a new
// claim starts again from the key's oldest pending row.
func ClaimFrom(ctx context.Context) (Claim, bool) {
	if ctx == nil {
		return Claim{}, false
	}
	c, ok := ctx.Value(claimKey{}).(Claim)
	return c, ok
}

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

// DefaultRetry is the relay's retry policy unless WithRetry says otherwise:
// 10 attempts, backoff ceilings from 100 ms doubling to 30 s (full jitter).
var DefaultRetry = keysched.RetryPolicy{MaxAttempts: 10, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 30 * time.Second, Multiplier: 2}

// A RelayOption configures NewRelay. Relay options meet as keysched.Option
// says: the last of a name wins (WithSchedulerOptions add up); bounds nest,
// and of two given the outer one applies (WithKeyBatch above WithBatchSize
// is lowered to it; WithPollInterval above a third of WithLeaseDuration is
// lowered to that third); a default gives way to a bound given
// (WithKeyBatch alone above DefaultBatchSize raises the batch size to it;
// WithPollInterval alone above a third of DefaultLeaseDuration raises the
// lease to three times it, at most MaxLeaseDuration; without WithWorkers, a
// keysched.WithMaxConcurrency or keysched.WithPool given with
// WithSchedulerOptions sizes the pool). A scheduler option's refusal keeps
// its *keysched.OptionError (errors.As), wrapped with ErrInvalidOption.
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
	retention   time.Duration
	listen      bool
	logger      *slog.Logger
	owner       string
	onDead      func(DeadEvent)
	takeOver    bool
	schedOpts   []keysched.Option
	// given, for how options meet (see NewRelay)
	workersSet, batchSet, pollSet, leaseSet bool
	maxOutage                               time.Duration
}

func badOption(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
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
		if p != keysched.Continue && p != keysched.Park {
			return badOption("WithFailurePolicy(%d)", int(p))
		}
		c.policy = p
		return nil
	}
}

// WithWorkers sets how many sink calls run at once, over all keys (the size
// of the relay scheduler's pool; default DefaultWorkers). n >= 1.
func WithWorkers(n int) RelayOption {
	return func(c *relayConfig) error {
		if n < 1 {
			return badOption("WithWorkers(%d)", n)
		}
		c.workers, c.workersSet = n, true
		return nil
	}
}

// WithSinkTimeout bounds each sink call (d > 0); a call that overruns is a
// failed, retried attempt. Default: bounded only by the key's lease.
func WithSinkTimeout(d time.Duration) RelayOption {
	return func(c *relayConfig) error {
		if d <= 0 {
			return badOption("WithSinkTimeout(%v)", d)
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
		if n < 1 {
			return badOption("WithBatchSize(%d)", n)
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
		if n < 1 {
			return badOption("WithKeyBatch(%d)", n)
		}
		c.keyBatch = n
		return nil
	}
}

// WithMaxKeys bounds how many keys the relay leases at once (default: the
// batch size). n >= 1.
func WithMaxKeys(n int) RelayOption {
	return func(c *relayConfig) error {
		if n < 1 {
			return badOption("WithMaxKeys(%d)", n)
		}
		c.maxKeys = n
		return nil
	}
}

// WithPollInterval sets how long the relay waits between polls when it
// found nothing to do (default DefaultPollInterval; capped at a third of
// WithLeaseDuration; given alone above a third of DefaultLeaseDuration it
// raises the lease to 3d: see RelayOption). On PostgreSQL a NOTIFY from a committed Write wakes it sooner
// (see WithListen). A full batch is followed by the next poll at once.
// d > 0.
func WithPollInterval(d time.Duration) RelayOption {
	return func(c *relayConfig) error {
		if d <= 0 {
			return badOption("WithPollInterval(%v)", d)
		}
		c.poll, c.pollSet = d, true
		return nil
	}
}

// WithLeaseDuration sets how long a relay's claim on a key lasts without
// renewal (default DefaultLeaseDuration; at least 30 ms, at most
// MaxLeaseDuration). The relay renews its
// leases every third of it. When a relay dies, its keys are taken over by
// another relay after at most this long. Choose it well above your sink's
// longest call and your database's longest stall.
func WithLeaseDuration(d time.Duration) RelayOption {
	return func(c *relayConfig) error {
		if d < 30*time.Millisecond || d > MaxLeaseDuration {
			return badOption("WithLeaseDuration(%v): at least 30ms, at most %v", d, MaxLeaseDuration)
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
		if d < 0 {
			return badOption("WithRetention(%v)", d)
		}
		c.retention = d
		return nil
	}
}

// WithListen turns PostgreSQL LISTEN/NOTIFY wake-ups on or off (default on;
// no effect on SQLite). When on, the relay holds one connection of the
// *sql.DB for as long as it runs: size the pool for it.
func WithListen(on bool) RelayOption {
	return func(c *relayConfig) error { c.listen = on; return nil }
}

// WithLogger sets where the relay logs database errors, lost leases and dead
// rows (default slog.Default()). nil is an error.
func WithLogger(l *slog.Logger) RelayOption {
	return func(c *relayConfig) error {
		if l == nil {
			return badOption("WithLogger(nil)")
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
		if name == "" || len(name) > 256 {
			return badOption("WithOwner(%q)", name)
		}
		c.owner = name
		return nil
	}
}

// WithTakeOverOnStart makes Run start by releasing the leases held under
// this relay's WithOwner name by other relays (other tokens), so that the
// keys of a crashed predecessor of that name are claimed at once instead of
// when their leases expire. It needs WithOwner (NewRelay fails without it).
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
		if d <= 0 {
			return badOption("WithMaxOutage(%v)", d)
		}
		c.maxOutage = d
		return nil
	}
}

// WithOnDead sets a function called after a row was marked dead, with the
// row (for alerting). It runs on the worker, while the key waits: keep it
// short.
func WithOnDead(fn func(DeadEvent)) RelayOption {
	return func(c *relayConfig) error {
		if fn == nil {
			return badOption("WithOnDead(nil)")
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
// The settings the relay's correctness rests on are applied after these and
// always win; giving them here has no effect:
//   - keysched.WithDeadLetter: the relay's dead letter marks the row dead in
//     the database (and calls WithOnDead); another function would leave it
//     unmarked, to be published again by the next tenure.
//   - keysched.WithFailurePolicy: always Continue in the scheduler; the relay
//     parks keys in the database (see the relay's WithFailurePolicy), where
//     every relay sees the park and it outlives a restart.
//   - keysched.WithMaxPending and keysched.WithMaxKeyDepth: the relay's batch
//     size (WithBatchSize) bounds what it submits, so its poll loop never
//     waits for room in its own scheduler while holding leases.
//   - keysched.WithRetryPanics: a panicking sink is retried like a failing
//     one, as the Sink contract says.
func WithSchedulerOptions(opts ...keysched.Option) RelayOption {
	return func(c *relayConfig) error {
		for i, o := range opts {
			if o == nil {
				return badOption("WithSchedulerOptions: option %d is nil", i)
			}
		}
		c.schedOpts = append(c.schedOpts, opts...)
		return nil
	}
}

// A Relay publishes an outbox's pending rows through a Sink: in order per
// key, keys in parallel, on a keysched.Scheduler[string] whose key is the
// row's key. Make one with Outbox.NewRelay, start it with Run, stop it with
// Close. Several relays (in one process or several) may run on one outbox:
// each key is published by one relay at a time (see the package doc).
//
// The zero Relay is not usable: use Outbox.NewRelay. The methods of a nil or
// zero Relay return ErrZeroRelay (those with an error result) or zero
// values, and do nothing else.
type Relay struct {
	o      *Outbox
	sink   Sink
	cfg    relayConfig
	sched  *keysched.Scheduler[string]
	log    *slog.Logger
	clock0 time.Time // the zero of mono()
	token  string    // fencing token: unique to this Relay, stored in its lease rows

	wake     chan struct{} // loop wake-up (cap 1)
	flushSig chan struct{} // flusher wake-up (cap 1)
	closing  chan struct{} // closed by Close
	done     chan struct{} // closed when Run returns
	started  atomic.Bool
	stopping atomic.Bool

	closeOnce sync.Once
	closeCtx  context.Context // set before closing is closed
	crash     bool            // tests: leave leases and marks as a crash would
	noMark    bool            // tests: never mark published rows (a crash right after publishing)
	// afterWalk, for tests, is called with the free keys a claim walk
	// found, before they are claimed (forces interleavings).
	afterWalk func(found []string)

	okCalls   atomic.Uint64 // successful database calls (walks, fetches, renewals, marks)
	lastClean int64         // loop goroutine only
	cursor    string        // loop goroutine only: where the next key walk starts
	fetchStmt *sql.Stmt

	// leaseMu makes claiming and renewing take turns, so that a renewal
	// sees every lease claimed before it (a key missing from its result is
	// really lost).
	leaseMu sync.Mutex

	mu       sync.Mutex // guards keys, inflight, settled, tenure.inflight, active
	keys     map[string]*tenure
	inflight int
	settled  int // rows settled since the last poll
	active   int // task functions running now
	idle     *sync.Cond

	fmu    sync.Mutex
	toMark []*job

	health health
	// shutdownErr: what Run's last database calls (marking the published
	// rows, releasing the leases) failed with; set before done is closed.
	shutdownErr error

	st struct {
		published, sinkErrors, marked, dead, abandoned, leasesLost atomic.Uint64
		polls, notifications, dbErrors                             atomic.Uint64
		keysHeld                                                   atomic.Int64
		listening                                                  atomic.Bool
	}
}

// A tenure is one holding of one key's lease by this relay. Tasks of a tenure
// that is lost (lease gone, key parked, a row given back) publish nothing;
// the key is then released and later claimed afresh from its oldest pending
// row.
type tenure struct {
	key      string
	epoch    int64        // the claim's epoch in the lease row
	deadline atomic.Int64 // r.mono() nanoseconds at which the lease ends locally
	lost     atomic.Bool
	// fenced ends when the database shows the lease taken by another
	// token (a renewal or a mark found it gone): the sink call in flight
	// on the key is cancelled.
	fenced   context.Context
	cancel   context.CancelFunc
	after    int64 // highest seq submitted in this tenure (loop goroutine)
	born     int64 // r.mono() when claimed
	inflight int   // rows of this tenure not settled (r.mu)
	fetched  bool  // rows fetched in the current poll (r.mu)
	// draining: the tenure is older than a lease; it fetches nothing more
	// and is released once its rows settle, so that the key is claimed
	// afresh from its oldest pending row (r.mu). That bounds how long a
	// row committed late with a lower seq than rows already fetched (two
	// PostgreSQL transactions on one key committing out of insert order)
	// waits behind the cursor.
	draining bool
}

func newTenure(key string, epoch, born, deadline int64) *tenure {
	t := &tenure{key: key, epoch: epoch, born: born}
	t.deadline.Store(deadline)
	t.fenced, t.cancel = context.WithCancel(context.Background())
	return t
}

// fence marks the tenure lost because its lease is no longer this relay's in
// the database, and cancels the key's sink call in flight. It reports
// whether the tenure was not lost before.
func (t *tenure) fence() bool {
	first := !t.lost.Swap(true)
	t.cancel()
	return first
}

type job struct {
	e Event
	t *tenure
}

type jobKey struct{}

// NewRelay returns a relay that publishes this outbox's pending rows with
// sink. It starts the relay's scheduler (and its pool of workers) but reads
// nothing before Run. Call Close to release it. A nil sink gets ErrNilSink, a
// bad option an error wrapping ErrInvalidOption, a nil or zero Outbox
// ErrZeroOutbox.
func (o *Outbox) NewRelay(sink Sink, opts ...RelayOption) (*Relay, error) {
	if o.zero() {
		return nil, ErrZeroOutbox
	}
	if sink == nil {
		return nil, ErrNilSink
	}
	cfg := relayConfig{
		retry:   DefaultRetry,
		workers: DefaultWorkers,
		batch:   DefaultBatchSize,
		poll:    DefaultPollInterval,
		lease:   DefaultLeaseDuration,
		listen:  true,
		logger:  slog.Default(),
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, badOption("nil RelayOption")
		}
		if err := opt(&cfg); err != nil {
			return nil, err
		}
	}
	// How the options meet: keysched.Option's rule (see RelayOption).
	if cfg.keyBatch == 0 {
		cfg.keyBatch = DefaultKeyBatch
	} else if !cfg.batchSet {
		cfg.batch = max(cfg.batch, cfg.keyBatch)
	}
	cfg.keyBatch = min(cfg.keyBatch, cfg.batch)
	if cfg.maxKeys == 0 {
		cfg.maxKeys = cfg.batch
	}
	if cfg.pollSet && !cfg.leaseSet {
		cfg.lease = min(max(cfg.lease, 3*cfg.poll), MaxLeaseDuration)
	}
	cfg.poll = min(cfg.poll, cfg.lease/3)
	if cfg.owner == "" {
		if cfg.takeOver {
			return nil, badOption("WithTakeOverOnStart without WithOwner: a random name has no predecessor")
		}
		cfg.owner = uuid.NewString()
	}
	r := &Relay{
		o: o, sink: sink, cfg: cfg, log: cfg.logger, clock0: time.Now(), token: uuid.NewString(),
		wake: make(chan struct{}, 1), flushSig: make(chan struct{}, 1),
		closing: make(chan struct{}), done: make(chan struct{}),
		keys: map[string]*tenure{},
	}
	r.idle = sync.NewCond(&r.mu)
	sopts := []keysched.Option{
		keysched.WithRetry(cfg.retry),
		keysched.WithLogger(cfg.logger),
	}
	if cfg.workersSet {
		// Without WithWorkers the scheduler's default (DefaultWorkers, the
		// same 64) gives way, as keysched.Option says, to a
		// keysched.WithMaxConcurrency or keysched.WithPool given with
		// WithSchedulerOptions.
		sopts = append(sopts, keysched.WithWorkers(cfg.workers))
	}
	if cfg.taskTimeout > 0 {
		sopts = append(sopts, keysched.WithTaskTimeout(cfg.taskTimeout))
	}
	// The caller's scheduler options, then the settings the relay's
	// correctness rests on, which win (see WithSchedulerOptions).
	sopts = append(sopts, cfg.schedOpts...)
	sopts = append(sopts,
		keysched.WithMaxPending(cfg.batch),
		keysched.WithMaxKeyDepth(cfg.batch),
		keysched.WithRetryPanics(),
		keysched.WithFailurePolicy(keysched.Continue),
		keysched.WithDeadLetter(r.onDeadLetter),
	)
	s, err := keysched.New[string](sopts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	r.sched = s
	return r, nil
}

// Scheduler returns the relay's scheduler (keys are the rows' keys), for
// metrics and inspection (e.g. otelkeysched's Metrics.Register, with its
// Observer given through WithSchedulerOptions; OldestAge and Keys report
// ages only with keysched.WithTaskAges or an observer). Do not submit to it, Close it, or Resume/Skip its
// keys: the relay owns it (use Relay.Resume and Relay.Skip).
func (r *Relay) Scheduler() *keysched.Scheduler[string] {
	if r.zero() {
		return nil
	}
	return r.sched
}

// Owner returns the relay's name in the lease table.
func (r *Relay) Owner() string {
	if r.zero() {
		return ""
	}
	return r.cfg.owner
}

// zero reports a nil Relay or one not made by Outbox.NewRelay.
func (r *Relay) zero() bool { return r == nil || r.sched == nil }

// Token returns the relay's fencing token: a random UUID made by NewRelay,
// unique to this Relay value, stored with its name in each lease row it
// holds (column token). See WithOwner. "" for a nil or zero Relay.
func (r *Relay) Token() string {
	if r.zero() {
		return ""
	}
	return r.token
}

// RelayStats is a snapshot of a relay's counters, read one by one.
type RelayStats struct {
	Published     uint64 // sink calls that returned nil
	SinkErrors    uint64 // sink calls that returned an error or panicked (each retry counts)
	Marked        uint64 // published rows marked sent (or deleted)
	Dead          uint64 // rows this relay marked dead
	Abandoned     uint64 // rows given back unpublished or unmarked: lease lost or ended, key parked, shutdown
	LeasesLost    uint64 // keys whose lease expired or was taken before this relay let it go
	Polls         uint64 // poll iterations
	Notifications uint64 // PostgreSQL NOTIFY wake-ups received
	DBErrors      uint64 // failed database calls (the relay retries; see DBErrorKinds)
	// DBErrorKinds splits DBErrors by kind (sqldb.Classify).
	DBErrorKinds DBErrorCounts
	// DBFailingFor is how long the database calls have been failing, with
	// no poll whose calls all succeeded since (0 while they succeed): for a
	// health check, compare it with the database's longest failover.
	DBFailingFor time.Duration
	KeysHeld     int // keys leased now
	InFlight     int // rows fetched and not yet settled
	// Listening is true while a PostgreSQL LISTEN for this outbox is
	// active (false on SQLite, with WithListen(false), and while the
	// listening connection is being re-established).
	Listening bool
}

// Stats returns a snapshot of the relay's counters.
func (r *Relay) Stats() RelayStats {
	if r.zero() {
		return RelayStats{}
	}
	r.mu.Lock()
	inflight := r.inflight
	r.mu.Unlock()
	failing, _, _, _ := r.outage()
	return RelayStats{
		DBErrorKinds: r.health.counts(), DBFailingFor: failing,
		Published: r.st.published.Load(), SinkErrors: r.st.sinkErrors.Load(),
		Marked: r.st.marked.Load(), Dead: r.st.dead.Load(), Abandoned: r.st.abandoned.Load(),
		LeasesLost: r.st.leasesLost.Load(), Polls: r.st.polls.Load(),
		Notifications: r.st.notifications.Load(), DBErrors: r.st.dbErrors.Load(),
		KeysHeld: int(r.st.keysHeld.Load()), InFlight: inflight,
		Listening: r.st.listening.Load(),
	}
}

// Parked returns the keys with a dead row (see Outbox.Parked): under the
// Park policy, the keys stopped until Resume or Skip.
func (r *Relay) Parked(ctx context.Context) ([]string, error) {
	if r.zero() {
		return nil, ErrZeroRelay
	}
	return r.o.Parked(ctx)
}

// Resume makes the key's oldest dead row pending again (Outbox.Resume) and
// wakes the relay. Any relay of the outbox then publishes it. After Close it
// returns ErrClosed and moves nothing (Outbox.Resume needs no relay).
func (r *Relay) Resume(ctx context.Context, key string) error {
	if r.zero() {
		return ErrZeroRelay
	}
	if r.closed() {
		return ErrClosed
	}
	if err := r.o.Resume(ctx, key); err != nil {
		return err
	}
	r.signal()
	return nil
}

// Skip gives up the key's oldest dead row (Outbox.Skip) and wakes the relay,
// so that under Park the key goes on with its next row.
func (r *Relay) Skip(ctx context.Context, key string) error {
	_, err := r.SkipHead(ctx, key)
	return err
}

// SkipHead is Skip that also returns the ID of the row it gave up (see
// Outbox.SkipHead). After Close, Skip and SkipHead return ErrClosed and move
// nothing (Outbox.Skip needs no relay).
func (r *Relay) SkipHead(ctx context.Context, key string) (string, error) {
	if r.zero() {
		return "", ErrZeroRelay
	}
	if r.closed() {
		return "", ErrClosed
	}
	id, err := r.o.SkipHead(ctx, key)
	if err != nil {
		return "", err
	}
	r.signal()
	return id, nil
}

// closed reports whether Close was called.
func (r *Relay) closed() bool {
	select {
	case <-r.closing:
		return true
	default:
		return false
	}
}

func (r *Relay) mono() int64 { return int64(time.Since(r.clock0)) }

func (r *Relay) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run reads and publishes pending rows until ctx ends or Close is called. A
// relay runs once: a second Run, or Run after Close, returns ErrClosed.
//
// When Close is called, Run stops claiming and fetching, lets the sink calls
// in progress finish (until Close's context ends: then their contexts are
// cancelled), gives back the rows that had not started (queued behind them,
// or waiting out a retry backoff), marks what was published, releases its
// leases and returns nil. When ctx ends, Run does the same at once: sink
// calls in progress see their context cancelled, and Run returns ctx's error
// once they have returned. Rows given back stay pending: they are published
// by this outbox's next relay to claim their key.
//
// Run first checks that the outbox's tables exist with the columns it uses:
// it returns an error wrapping ErrNoSchema (a table missing) or
// ErrSchemaOutdated (the lease table without its token or epoch column, or
// no epoch counter) at once. A
// database that does not answer is an outage, not an error: Run retries
// every poll interval, then and while it runs, and returns because of the
// database only with WithMaxOutage (an error wrapping
// ErrDatabaseUnavailable). See the package doc's "Database faults".
func (r *Relay) Run(ctx context.Context) error {
	if r.zero() {
		return ErrZeroRelay
	}
	if ctx == nil {
		return keysched.ErrNilContext
	}
	if !r.started.CompareAndSwap(false, true) {
		return ErrClosed
	}
	defer close(r.done)
	doneCtx, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	select {
	case <-r.closing:
		// Close came after Run started but before this: Close leaves the
		// scheduler to Run, which has submitted nothing yet.
		_ = r.sched.Close(r.closeCtx)
		return ErrClosed
	default:
	}
	if err := r.checkSchema(ctx); err != nil {
		_ = r.sched.Close(doneCtx)
		return err
	}
	if r.cfg.takeOver {
		// The predecessor's keys are free at once (see WithTakeOverOnStart).
		cctx, cancel := r.callCtx(ctx)
		res, err := r.o.db.ExecContext(cctx, r.o.q.releaseOthers, r.cfg.owner, r.token)
		cancel()
		if err != nil {
			r.dbError("take over the leases of the relay's name", err)
		} else if n, _ := res.RowsAffected(); n > 0 {
			r.log.Info("outbox relay: took over the leases of a previous relay of the same name", "table", r.o.table, "owner", r.cfg.owner, "keys", n)
		}
	}
	bg, cancelBG := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBG()
	// The loop's database calls end with ctx, and when Close's context
	// ends; the flusher's and renewer's too (Run's last marks and release
	// then run on a context of their own).
	loopCtx, cancelLoop := context.WithCancel(ctx)
	defer cancelLoop()
	go func() {
		select {
		case <-r.closing:
			select {
			case <-r.closeCtx.Done():
				cancelLoop()
				cancelBG()
			case <-loopCtx.Done():
			}
		case <-loopCtx.Done():
		}
	}()
	var wg sync.WaitGroup
	stopFlush := make(chan struct{})
	wg.Add(2)
	go func() { defer wg.Done(); r.flusher(bg, stopFlush) }()
	go func() { defer wg.Done(); r.renewer(bg, stopFlush) }()
	lctx, cancelListen := context.WithCancel(ctx)
	defer cancelListen()
	if r.o.dialect == Postgres && r.cfg.listen {
		wg.Add(1)
		go func() { defer wg.Done(); r.listen(lctx) }()
	}

	if r.o.dialect == SQLite {
		// One query per key and poll: parse it once (pgx caches its
		// statements by itself).
		q := r.o.q.fetch
		if r.cfg.policy == keysched.Park {
			q = r.o.q.fetchPark
		}
		if st, err := r.o.db.PrepareContext(ctx, q); err == nil {
			r.fetchStmt = st
			defer st.Close()
		}
	}
	err := r.loop(loopCtx, ctx)

	// Shut down: no claim after this; tasks that have not started give
	// their rows back.
	r.stopping.Store(true)
	closeCtx := context.Context(nil)
	if err == nil {
		closeCtx = r.closeCtx
	} else {
		c, cancel := context.WithCancel(context.Background())
		cancel()
		closeCtx = c
	}
	_ = r.sched.Close(closeCtx) // aborted tasks come back through onDeadLetter
	r.waitTasks()               // a sink call Close gave up on must return before the key is let go
	close(stopFlush)
	cancelListen()
	wg.Wait()
	if !r.crash {
		// Each bounded as every call (callTimeout): a database that is
		// away does not hold Run (nor Close: see there) for ever.
		fctx, cancel := r.callCtx(context.WithoutCancel(ctx))
		if !r.flushAll(fctx) {
			r.fmu.Lock()
			n := len(r.toMark)
			r.fmu.Unlock()
			_, _, _, last := r.outage()
			if last == nil {
				last = errors.New("marking failed")
			}
			r.shutdownErr = fmt.Errorf("outbox: %d published rows not marked sent (they stay pending: published again once their leases expire): %w", n, last)
		}
		cancel()
		fctx, cancel = r.callCtx(context.WithoutCancel(ctx))
		if _, e := r.o.db.ExecContext(fctx, r.o.q.releaseAll, r.cfg.owner, r.token); e != nil {
			r.dbError("release leases", e)
			r.shutdownErr = errors.Join(r.shutdownErr, fmt.Errorf("outbox: leases not released (their keys wait until they expire): %w", e))
		}
		cancel()
	}
	r.st.keysHeld.Store(0)
	return err
}

// Close stops the relay: see Run. It waits for Run to return, or for ctx to
// end: then the sink calls in progress see their context cancelled, the rows
// not started are given back, the poll's database calls are cancelled, and
// Close returns within keysched.CloseGrace (100 ms) of ctx's end, whatever
// the sink and the database do. If Run is then still marking the published
// rows and releasing its leases (the database is slow or away), Close
// returns an error wrapping ctx's error that says so; those calls go on in
// the background, each bounded by a third of the lease, at least 5 s. If a sink call still
// runs after the grace (it ignores its cancelled context), Close returns an error
// wrapping ctx's error that counts the sink calls still running; they finish
// in the background and Run returns once they have: a call that then
// succeeds is marked sent (the relay keeps the key's lease until then, so no
// other relay publishes the key meanwhile), one that fails leaves its row
// pending, and the relay then releases its leases. If the process exits
// first, those rows stay pending and are published again (duplicates) once
// the leases expire. Close returns nil when Run finished in time, ctx's error
// (wrapped) otherwise; when Run's last calls failed (published rows not
// marked sent: they are published again once their leases expire; leases
// not released: their keys wait until they expire), an error saying so,
// wrapping the database's. Close without Run releases the scheduler. Close is
// idempotent; only the first call's ctx bounds the drain. A nil ctx gets
// ErrNilContext.
func (r *Relay) Close(ctx context.Context) error {
	if r.zero() {
		return ErrZeroRelay
	}
	if ctx == nil {
		return keysched.ErrNilContext
	}
	r.closeOnce.Do(func() {
		r.closeCtx = ctx
		close(r.closing)
	})
	if r.started.CompareAndSwap(false, true) {
		close(r.done)
		return r.sched.Close(ctx)
	}
	select {
	case <-r.done:
		if r.shutdownErr != nil {
			return fmt.Errorf("outbox: close: %w", r.shutdownErr)
		}
		return nil
	case <-ctx.Done():
	}
	grace := time.NewTimer(keysched.CloseGrace)
	defer grace.Stop()
	select {
	case <-r.done:
		return fmt.Errorf("outbox: close: %w", ctx.Err())
	case <-grace.C:
	}
	r.mu.Lock()
	running := r.active
	r.mu.Unlock()
	if running > 0 {
		return fmt.Errorf("outbox: close: %d sink calls still running (ignoring their cancelled context), left to finish in the background: %w", running, ctx.Err())
	}
	// Run is marking what was published and releasing its leases: the
	// database is slow or away. Those calls go on in the background, each
	// bounded by callTimeout.
	return fmt.Errorf("outbox: close: still marking published rows and releasing leases (the database is slow or away; last: %w), left to finish in the background: %w", r.lastDBError(), ctx.Err())
}

// lastDBError returns the last failed database call's error while the
// database is failing, or "no database error".
func (r *Relay) lastDBError() error {
	if _, _, op, err := r.outage(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return errors.New("no answer")
}

func (r *Relay) beginTask() {
	r.mu.Lock()
	r.active++
	r.mu.Unlock()
}

func (r *Relay) endTask() {
	r.mu.Lock()
	r.active--
	if r.active == 0 {
		r.idle.Broadcast()
	}
	r.mu.Unlock()
}

func (r *Relay) waitTasks() {
	r.mu.Lock()
	for r.active > 0 {
		r.idle.Wait()
	}
	r.mu.Unlock()
}

// loop polls until runCtx ends, Close is called, or the database stays
// away longer than WithMaxOutage. Its database calls use ctx (runCtx, also
// cancelled when Close's context ends).
func (r *Relay) loop(ctx, runCtx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-runCtx.Done():
			return runCtx.Err()
		case <-r.closing:
			return nil
		default:
		}
		fails, oks := r.health.total.Load(), r.okCalls.Load()
		full := r.poll(ctx)
		if r.health.total.Load() == fails && r.okCalls.Load() != oks {
			r.dbOK(groupPoll)
		} else if err := r.outageOver(); err != nil {
			return err
		}
		if full {
			continue // a full batch: there may be more at once
		}
		timer.Reset(r.cfg.poll)
		select {
		case <-runCtx.Done():
			return runCtx.Err()
		case <-r.closing:
			return nil
		case <-r.wake:
		case <-timer.C:
		}
	}
}

// outageOver returns an error wrapping ErrDatabaseUnavailable once the
// database has been failing for WithMaxOutage.
func (r *Relay) outageOver() error {
	if r.cfg.maxOutage <= 0 {
		return nil
	}
	d, tries, op, err := r.outage()
	if d < r.cfg.maxOutage {
		return nil
	}
	r.log.Error("outbox relay: database away longer than WithMaxOutage; Run returns", "for", d.Round(time.Millisecond), "tries", tries, "table", r.o.table, "owner", r.cfg.owner, "err", err)
	return fmt.Errorf("%w: every poll failed for %v (%d failed calls; max outage %v); last: %s: %w", ErrDatabaseUnavailable, d.Round(time.Millisecond), tries, r.cfg.maxOutage, op, err)
}

// callTimeout bounds each of the relay's database operations (a claim, a
// fetch, a renewal, a mark): a third of the lease, at least 5 s. A call
// that hangs (a server that stopped answering, a network partition) fails
// then, rather than holding the relay until TCP gives up.
func (r *Relay) callTimeout() time.Duration { return max(r.cfg.lease/3, 5*time.Second) }

func (r *Relay) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.callTimeout())
}

// checkSchema checks, before Run claims anything, that the outbox and lease
// tables exist and have the columns the relay uses. A database that does not
// answer is retried every poll interval (an outage, bounded by
// WithMaxOutage); a missing schema is an error at once.
func (r *Relay) checkSchema(ctx context.Context) error {
	wait := time.NewTimer(time.Hour)
	defer wait.Stop()
	for {
		cctx, cancel := r.callCtx(ctx)
		var err error
		var which string
		for _, p := range []struct{ what, q string }{
			{r.o.table, r.o.q.probeTable},
			{r.o.table + "_lease", r.o.q.probeColumns},
			{r.o.table + "_lease_epoch", r.o.q.probeEpoch},
		} {
			if _, err = r.o.db.ExecContext(cctx, p.q); err != nil {
				which = p.what
				break
			}
		}
		cancel()
		switch {
		case err == nil:
			r.okCalls.Add(1)
			r.dbOK(groupPoll)
			return nil
		case which == r.o.table+"_lease" && sqldb.IsUndefinedColumn(err),
			which == r.o.table+"_lease_epoch" && sqldb.Classify(err) == sqldb.KindSchema:
			// A lease table of an older schema (no token or epoch
			// column, no epoch counter): claims would fail forever, and
			// a relay of an older version may be running on it.
			return fmt.Errorf("%w: %s: %w", ErrSchemaOutdated, which, err)
		case sqldb.Classify(err) == sqldb.KindSchema:
			return fmt.Errorf("%w: table %s: %w", ErrNoSchema, which, err)
		case ctx.Err() != nil:
			return ctx.Err()
		}
		r.dbError("check the schema", err)
		if err := r.outageOver(); err != nil {
			return err
		}
		wait.Reset(r.cfg.poll)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.closing:
			return ErrClosed
		case <-wait.C:
		}
	}
}

// poll does one round: renew leases when due, let ended tenures go, claim
// keys, fetch and submit their rows, delete expired sent rows when due. It
// reports whether the batch was filled (more may be waiting).
func (r *Relay) poll(ctx context.Context) (full bool) {
	r.st.polls.Add(1)
	r.releaseEnded(ctx)
	r.mu.Lock()
	room := r.cfg.batch - r.inflight
	held := len(r.keys)
	r.settled = 0
	r.mu.Unlock()
	if room > 0 {
		if held < r.cfg.maxKeys {
			r.acquire(ctx, room)
		}
		n := r.fetch(ctx, room)
		full = n == room
		r.releaseEnded(ctx)
	}
	if r.cfg.retention > 0 && r.mono()-r.lastClean >= int64(max(r.cfg.poll*10, time.Second)) {
		r.cleanup(ctx)
	}
	return full
}

// renewer renews the relay's leases every third of the lease duration, on
// its own goroutine so that a slow poll cannot make them lapse.
func (r *Relay) renewer(ctx context.Context, stop <-chan struct{}) {
	tick := time.NewTicker(r.cfg.lease / 3)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			r.renew(ctx)
		}
	}
}

func (r *Relay) renew(ctx context.Context) {
	ctx, cancel := r.callCtx(ctx)
	defer cancel()
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	// Only the keys held: a lease row of this token without a tenure (its
	// release failed, or a claim's answer was lost) is left to expire, so
	// that other relays can take its key.
	r.mu.Lock()
	held := make([]claimed, 0, len(r.keys))
	for k, t := range r.keys {
		held = append(held, claimed{k, t.epoch})
	}
	r.mu.Unlock()
	if len(held) == 0 {
		r.dbOK(groupRenew) // nothing to renew: nothing failing
		return
	}
	sortClaims(held) // one lock order for every relay
	start := r.mono()
	var keys map[string]int64
	var err error
	if r.o.dialect == Postgres {
		ks, es := splitClaims(held)
		keys, err = r.queryClaims(ctx, r.o.db, r.o.q.renew, r.cfg.owner, r.token, r.cfg.lease.Microseconds(), ks, es)
	} else {
		exp := time.Now().Add(r.cfg.lease).UnixMicro()
		keys = map[string]int64{}
		err = r.sqliteTx(ctx, func(tx *sql.Tx) error {
			for rest := held; len(rest) > 0; {
				n := min(len(rest), 400)
				args := make([]any, 0, 2*n+3)
				args = append(args, exp, r.cfg.owner, r.token)
				for _, c := range rest[:n] {
					args = append(args, c.key, c.epoch)
				}
				ks, err := r.queryClaims(ctx, tx, r.o.q.renew+pairList(n)+" RETURNING key, epoch", args...)
				if err != nil {
					return err
				}
				for k, e := range ks {
					keys[k] = e
				}
				rest = rest[n:]
			}
			return nil
		})
	}
	if err != nil {
		r.dbError(opRenew, err)
		return
	}
	r.okCalls.Add(1)
	r.dbOK(groupRenew)
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, t := range r.keys {
		if e, ok := keys[k]; ok && e == t.epoch {
			t.deadline.Store(start + int64(r.cfg.lease))
		} else if t.fence() {
			r.st.leasesLost.Add(1)
			r.log.Warn("outbox relay: lease on key lost (expired and taken over, or taken by another relay); its sink call in flight is cancelled, its rows in flight are given back", "table", r.o.table, "owner", r.cfg.owner, "token", r.token, "epoch", t.epoch)
		}
	}
}

// A claimed is a claim of a key: the key and the claim's epoch.
type claimed struct {
	key   string
	epoch int64
}

func sortClaims(cs []claimed) {
	sort.Slice(cs, func(i, j int) bool { return cs[i].key < cs[j].key })
}

func splitClaims(cs []claimed) (keys []string, epochs []int64) {
	keys, epochs = make([]string, len(cs)), make([]int64, len(cs))
	for i, c := range cs {
		keys[i], epochs[i] = c.key, c.epoch
	}
	return keys, epochs
}

// queryClaims runs a statement returning (key, epoch) rows.
func (r *Relay) queryClaims(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, query string, args ...any) (map[string]int64, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	keys := map[string]int64{}
	for rows.Next() {
		var k string
		var e int64
		if err := rows.Scan(&k, &e); err != nil {
			return nil, err
		}
		keys[k] = e
	}
	return keys, rows.Err()
}

// releaseEnded forgets tenures with nothing in flight that are lost or found
// idle, and deletes their lease rows (those still ours).
func (r *Relay) releaseEnded(ctx context.Context) {
	var ended []claimed
	r.mu.Lock()
	for k, t := range r.keys {
		if t.inflight == 0 && (t.lost.Load() || !t.fetched || t.draining) {
			t.cancel()
			delete(r.keys, k)
			ended = append(ended, claimed{k, t.epoch})
		}
	}
	r.st.keysHeld.Store(int64(len(r.keys)))
	r.mu.Unlock()
	if len(ended) == 0 {
		return
	}
	ctx, cancel := r.callCtx(ctx)
	defer cancel()
	sortClaims(ended) // one lock order for every statement on lease rows
	var err error
	if r.o.dialect == Postgres {
		ks, es := splitClaims(ended)
		_, err = r.o.db.ExecContext(ctx, r.o.q.release, r.cfg.owner, r.token, ks, es)
	} else {
		for len(ended) > 0 && err == nil {
			n := min(len(ended), 400)
			args := []any{r.cfg.owner, r.token}
			for _, c := range ended[:n] {
				args = append(args, c.key, c.epoch)
			}
			_, err = r.o.db.ExecContext(ctx, r.o.q.release+pairList(n), args...)
			ended = ended[n:]
		}
	}
	if err != nil {
		// The leases expire by themselves; the keys are only delayed.
		r.dbError("release leases", err)
	}
}

func (r *Relay) sqliteTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := r.o.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// acquire claims up to room keys that have pending rows and no live lease.
func (r *Relay) acquire(ctx context.Context, room int) {
	ctx, cancel := r.callCtx(ctx)
	defer cancel()
	q := r.o.q.candidates
	if r.cfg.policy == keysched.Park {
		q = r.o.q.candidatesPark
	}
	// Visit at most this many keys per poll; the cursor moves on, and
	// wraps around at the last key, so every key gets its turn.
	walk := 4*room + 64
	args := []any{r.cursor, walk}
	if r.o.dialect == SQLite {
		args = append(args, time.Now().UnixMicro())
	}
	// A lease of this relay's token with no tenure (its release failed) is
	// free to it: it has nothing of the key in flight. A live lease of any
	// other token is not, whatever its owner name.
	args = append(args, r.cfg.owner, r.token)
	rows, err := r.o.db.QueryContext(ctx, q, args...)
	if err != nil {
		r.dbError("find keys", err)
		return
	}
	var found []string
	visited, last := 0, ""
	for rows.Next() {
		var k string
		var free bool
		if err := rows.Scan(&k, &free); err != nil {
			rows.Close()
			r.dbError("find keys", err)
			return
		}
		visited++
		last = k
		if free {
			found = append(found, k)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		r.dbError("find keys", err)
		return
	}
	r.okCalls.Add(1)
	if r.afterWalk != nil {
		r.afterWalk(found)
	}
	if visited < walk {
		r.cursor = "" // reached the last key: start over next time
	} else {
		r.cursor = last
	}
	var cands []string
	seen := map[string]bool{}
	r.mu.Lock()
	// A key claimed without a slot to fill would only be released again.
	limit := min(r.cfg.maxKeys-len(r.keys), room)
	for _, k := range found {
		if !seen[k] && r.keys[k] == nil && len(cands) < limit {
			seen[k] = true
			cands = append(cands, k)
		}
	}
	r.mu.Unlock()
	if len(cands) == 0 {
		return
	}
	sort.Strings(cands) // one lock order for every relay
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	start := r.mono()
	got := map[string]int64{} // key -> the claim's epoch
	if r.o.dialect == Postgres {
		micros := r.cfg.lease.Microseconds()
		ins, err := r.queryClaims(ctx, r.o.db, r.o.q.acquireInsert, cands, r.cfg.owner, micros, r.token)
		if err != nil {
			r.dbError("claim keys", err)
			return
		}
		var rest []string
		for _, k := range cands {
			if e, ok := ins[k]; ok {
				got[k] = e
			} else {
				rest = append(rest, k)
			}
		}
		if len(rest) > 0 {
			taken, err := r.queryClaims(ctx, r.o.db, r.o.q.acquireTakeover, rest, r.cfg.owner, micros, r.token)
			if err != nil {
				r.dbError("take over expired keys", err)
			}
			for k, e := range taken {
				got[k] = e
			}
		}
	} else {
		now := time.Now()
		exp := now.Add(r.cfg.lease).UnixMicro()
		for len(cands) > 0 {
			n := min(len(cands), 150)
			args := make([]any, 0, 5*n+1)
			var b strings.Builder
			for i, k := range cands[:n] {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString("(?, ?, ?, ?, ?)")
				args = append(args, k, r.cfg.owner, exp, r.token, i+1)
			}
			args = append(args, now.UnixMicro())
			ks, err := r.queryClaims(ctx, r.o.db, fmt.Sprintf(r.o.q.acquireUpsert, b.String()), args...)
			if err != nil {
				r.dbError("claim keys", err)
				break
			}
			for k, e := range ks {
				got[k] = e
			}
			cands = cands[n:]
		}
	}
	r.mu.Lock()
	for k, e := range got {
		r.keys[k] = newTenure(k, e, start, start+int64(r.cfg.lease))
	}
	r.st.keysHeld.Store(int64(len(r.keys)))
	r.mu.Unlock()
}

// fetch reads up to room pending rows of the held keys, beyond what each
// tenure already submitted, and submits them in order. It returns how many
// it submitted.
func (r *Relay) fetch(ctx context.Context, room int) int {
	type want struct {
		t     *tenure
		limit int
	}
	var wants []want
	now := r.mono()
	r.mu.Lock()
	for _, t := range r.keys {
		t.fetched = t.inflight > 0
		if now-t.born > int64(r.cfg.lease) {
			t.draining = true
		}
		if t.lost.Load() || t.draining {
			continue
		}
		if l := r.cfg.keyBatch - t.inflight; l > 0 {
			wants = append(wants, want{t, l})
		}
	}
	r.mu.Unlock()
	if len(wants) == 0 {
		return 0
	}
	ctx, cancel := r.callCtx(ctx)
	defer cancel()
	var evs []Event
	var err error
	fetchQ := r.o.q.fetch
	if r.cfg.policy == keysched.Park {
		fetchQ = r.o.q.fetchPark
	}
	if r.o.dialect == Postgres {
		keys := make([]string, len(wants))
		afters := make([]int64, len(wants))
		epochs := make([]int64, len(wants))
		for i, w := range wants {
			keys[i], afters[i], epochs[i] = w.t.key, w.t.after, w.t.epoch
		}
		evs, err = r.scanEvents(r.o.db.QueryContext(ctx, fetchQ, keys, afters, r.cfg.keyBatch, room, epochs, r.cfg.owner, r.token))
	} else {
		left := room
		for _, w := range wants {
			if left == 0 {
				break
			}
			var rows *sql.Rows
			var e error
			args := []any{w.t.key, w.t.after, r.cfg.owner, r.token, w.t.epoch, min(w.limit, left)}
			if r.fetchStmt != nil {
				rows, e = r.fetchStmt.QueryContext(ctx, args...)
			} else {
				rows, e = r.o.db.QueryContext(ctx, fetchQ, args...)
			}
			more, e := r.scanEvents(rows, e)
			if e != nil {
				err = e
				break
			}
			evs = append(evs, more...)
			left -= len(more)
		}
	}
	if err != nil {
		r.dbError("fetch rows", err)
		// Rows read before the error are still submitted below: each key's
		// rows are complete up to where they stop.
	} else {
		r.okCalls.Add(1)
	}
	quota := make(map[*tenure]int, len(wants))
	for _, w := range wants {
		quota[w.t] = w.limit
	}
	stopped := map[*tenure]bool{}
	n := 0
	r.mu.Lock()
	byKey := make(map[string]*tenure, len(wants))
	for _, w := range wants {
		byKey[w.t.key] = w.t
	}
	r.mu.Unlock()
	for _, e := range evs {
		t := byKey[e.Key]
		if t == nil || stopped[t] || quota[t] == 0 || n == room {
			// Never submit a later row of a key whose earlier row was
			// left out: the cursor would pass over it.
			if t != nil {
				stopped[t] = true
			}
			continue
		}
		quota[t]--
		r.submit(t, e)
		n++
	}
	return n
}

func (r *Relay) scanEvents(rows *sql.Rows, err error) ([]Event, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var evs []Event
	for rows.Next() {
		var e Event
		var headers sql.NullString
		var attempts int
		created := r.o.q.timeDest()
		if err := rows.Scan(&e.Seq, &e.ID, &e.Key, &e.Type, &e.Payload, &headers, created, &attempts); err != nil {
			return evs, err
		}
		e.CreatedAt = r.o.q.timeOf(created)
		if e.Headers, err = decodeHeaders(headers); err != nil {
			return evs, err
		}
		evs = append(evs, e)
	}
	return evs, rows.Err()
}

func (r *Relay) submit(t *tenure, e Event) {
	j := &job{e: e, t: t}
	r.mu.Lock()
	r.inflight++
	t.inflight++
	t.fetched = true
	r.mu.Unlock()
	t.after = e.Seq
	jctx := context.WithValue(context.Background(), jobKey{}, j)
	if _, err := r.sched.TrySubmit(jctx, e.Key, func(ctx context.Context) error { return r.runJob(ctx, j) }); err != nil {
		// Cannot happen while the bounds match the batch; give the row
		// back and start the key afresh rather than lose it.
		r.log.Error("outbox relay: scheduler refused a row", "err", err)
		r.abandon(j)
	}
}

func (r *Relay) runJob(ctx context.Context, j *job) error {
	r.beginTask()
	defer r.endTask()
	t := j.t
	if t.lost.Load() || r.stopping.Load() {
		r.abandon(j)
		return nil
	}
	dl := t.deadline.Load()
	if r.mono() >= dl {
		if !t.lost.Swap(true) {
			r.st.leasesLost.Add(1)
		}
		r.abandon(j)
		return nil
	}
	sctx, cancel := context.WithDeadline(ctx, r.clock0.Add(time.Duration(dl)))
	defer cancel()
	sctx = context.WithValue(sctx, claimKey{}, Claim{Key: t.key, Owner: r.cfg.owner, Token: r.token, Epoch: t.epoch})
	unhook := context.AfterFunc(t.fenced, cancel) // the lease was taken: stop the call
	defer unhook()
	returned := false
	defer func() {
		if !returned { // the sink panicked (or called runtime.Goexit): a failed call
			r.st.sinkErrors.Add(1)
		}
	}()
	err := r.sink(sctx, j.e)
	returned = true
	unhook()
	cancel()
	if err == nil {
		r.st.published.Add(1)
		if r.noMark {
			return nil
		}
		r.fmu.Lock()
		r.toMark = append(r.toMark, j)
		r.fmu.Unlock()
		select {
		case r.flushSig <- struct{}{}:
		default:
		}
		return nil
	}
	r.st.sinkErrors.Add(1)
	if t.lost.Load() || r.mono() >= t.deadline.Load() || (r.stopping.Load() && ctx.Err() != nil) {
		// The lease ended or the relay is stopping: not the row's failure.
		t.lost.Store(true)
		r.abandon(j)
		return nil
	}
	return err
}

// onDeadLetter receives rows whose sink calls failed for good, and rows the
// scheduler's Close gave up on.
func (r *Relay) onDeadLetter(dl keysched.DeadLetter[string]) {
	j, _ := dl.Context.Value(jobKey{}).(*job)
	if j == nil {
		r.log.Error("outbox relay: dead letter without its row", "err", dl.Err)
		return
	}
	if r.stopping.Load() || errors.Is(dl.Err, keysched.ErrAborted) || j.t.lost.Load() || r.mono() >= j.t.deadline.Load() {
		j.t.lost.Store(true)
		r.abandon(j)
		return
	}
	msg := "<nil>"
	if dl.Err != nil {
		msg = dl.Err.Error()
	}
	if len(msg) > 4096 {
		msg = msg[:4096]
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.lease/3)
	defer cancel()
	var res sql.Result
	var err error
	if r.o.dialect == Postgres {
		res, err = r.o.db.ExecContext(ctx, r.o.q.markDead, j.e.Seq, r.cfg.owner, r.token, dl.Attempts, msg, j.e.Key, j.t.epoch)
	} else {
		res, err = r.o.db.ExecContext(ctx, r.o.q.markDead, dl.Attempts, msg, time.Now().UnixMicro(), j.e.Seq, r.cfg.owner, r.token, j.t.epoch)
	}
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil && n == 0 {
		// The key's lease is no longer ours: another relay holds the key
		// and decides about the row.
		if j.t.fence() {
			r.st.leasesLost.Add(1)
			r.log.Warn("outbox relay: lease on key lost (taken by another relay) before a failed row was marked dead; the row is left to it", "table", r.o.table, "owner", r.cfg.owner, "token", r.token, "epoch", j.t.epoch, "seq", j.e.Seq)
		}
		r.abandon(j)
		return
	}
	if err != nil {
		// Not marked: the row stays pending and its key starts afresh
		// (it will be retried), rather than the key moving past it.
		r.dbError("mark row dead", err)
		j.t.lost.Store(true)
		r.abandon(j)
		return
	}
	r.st.dead.Add(1)
	r.log.Warn("outbox relay: row failed for good, marked dead", "table", r.o.table, "id", j.e.ID, "seq", j.e.Seq, "attempts", dl.Attempts, "err", dl.Err, "park", r.cfg.policy == keysched.Park)
	if r.cfg.policy == keysched.Park {
		// The key's later rows in flight give themselves back; the key's
		// dead row keeps every relay off it until Resume or Skip.
		j.t.lost.Store(true)
	}
	if r.cfg.onDead != nil {
		r.cfg.onDead(DeadEvent{Event: j.e, Attempts: dl.Attempts, Err: msg, DiedAt: time.Now().UTC()})
	}
	r.settle(j)
}

func (r *Relay) abandon(j *job) {
	r.st.abandoned.Add(1)
	j.t.lost.Store(true)
	r.settle(j)
}

func (r *Relay) settle(j *job) {
	r.mu.Lock()
	r.inflight--
	j.t.inflight--
	r.settled++
	// Refill once half a batch has settled (or the relay is half
	// empty): a poll per settled row would read the held keys over and
	// over for one row each. Counting settled rows, not free slots, keeps
	// the refill rate when a failing key holds some slots for long.
	refill := r.settled >= r.cfg.batch/2 || r.inflight <= r.cfg.batch/2
	r.mu.Unlock()
	if refill {
		r.signal()
	}
}

func (r *Relay) flusher(ctx context.Context, stop <-chan struct{}) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-stop:
			return
		case <-r.flushSig:
		case <-retry.C:
		}
		if !r.flushAll(ctx) {
			retry.Reset(r.cfg.poll)
		}
	}
}

// flushAll marks every published row sent (or deletes it), in one statement
// per chunk, only on keys whose lease this relay still holds (its owner name
// and token). On failure the rows stay queued, in order, for the next try. A
// row the statement did not mark is on a key whose lease another relay took
// (or that relay already settled the row): the tenure is fenced and the row
// given back, pending, to the key's holder, which publishes it again.
func (r *Relay) flushAll(ctx context.Context) bool {
	r.fmu.Lock()
	batch := r.toMark
	r.toMark = nil
	r.fmu.Unlock()
	if len(batch) == 0 {
		r.dbOK(groupMark) // nothing to mark: nothing failing
		return true
	}
	ctx, cancel := r.callCtx(ctx)
	defer cancel()
	seqs := make([]int64, len(batch))
	keys := make([]string, len(batch))
	epochs := make([]int64, len(batch))
	for i, j := range batch {
		seqs[i], keys[i], epochs[i] = j.e.Seq, j.e.Key, j.t.epoch
	}
	marked := make(map[int64]bool, len(batch))
	collect := func(rows *sql.Rows, err error) error {
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s int64
			if err := rows.Scan(&s); err != nil {
				return err
			}
			marked[s] = true
		}
		return rows.Err()
	}
	var err error
	if r.o.dialect == Postgres {
		q := r.o.q.markSentDelete
		if r.cfg.retention > 0 {
			q = r.o.q.markSentUpdate
		}
		err = collect(r.o.db.QueryContext(ctx, q, seqs, keys, epochs, r.cfg.owner, r.token))
	} else {
		err = r.sqliteTx(ctx, func(tx *sql.Tx) error {
			for rest := batch; len(rest) > 0; {
				n := min(len(rest), 400)
				args := make([]any, 0, 2*n+3)
				q := r.o.q.markSentDelete
				if r.cfg.retention > 0 {
					q = r.o.q.markSentUpdate
					args = append(args, time.Now().UnixMicro())
				}
				var b strings.Builder
				for i, j := range rest[:n] {
					if i > 0 {
						b.WriteString(", ")
					}
					b.WriteString("(?, ?)")
					args = append(args, j.e.Seq, j.t.epoch)
				}
				args = append(args, r.cfg.owner, r.token)
				if err := collect(tx.QueryContext(ctx, q+b.String()+r.o.q.markSentSuffix, args...)); err != nil {
					return err
				}
				rest = rest[n:]
			}
			return nil
		})
	}
	if err != nil {
		r.dbError(opMark, err)
		r.fmu.Lock()
		r.toMark = append(batch, r.toMark...)
		r.fmu.Unlock()
		return false
	}
	r.okCalls.Add(1)
	r.dbOK(groupMark)
	r.st.marked.Add(uint64(len(marked)))
	for _, j := range batch {
		if marked[j.e.Seq] {
			r.settle(j)
			continue
		}
		if j.t.fence() {
			r.st.leasesLost.Add(1)
			r.log.Warn("outbox relay: lease on key lost (taken by another relay) before its published rows were marked; they stay pending for the key's holder", "table", r.o.table, "owner", r.cfg.owner, "token", r.token, "epoch", j.t.epoch)
		}
		r.abandon(j)
	}
	return true
}

func (r *Relay) cleanup(ctx context.Context) {
	ctx, cancel := r.callCtx(ctx)
	defer cancel()
	r.lastClean = r.mono()
	var err error
	if r.o.dialect == Postgres {
		_, err = r.o.db.ExecContext(ctx, r.o.q.cleanup, r.cfg.retention.Microseconds(), 10000)
	} else {
		_, err = r.o.db.ExecContext(ctx, r.o.q.cleanup, time.Now().Add(-r.cfg.retention).UnixMicro(), 10000)
	}
	if err != nil {
		r.dbError("delete sent rows past retention", err)
	}
}

func permanent(err error) error { return keysched.Permanent(err) }
