// Package service is the webhook delivery service: partners POST events, the
// service persists each one (an outbox row and an intake record, one
// transaction) and delivers it to the partner's customer endpoint, in order
// per partner, at least once.
//
// The pieces, in the order an event meets them:
//
//   - intake (POST /events/{partner}): checks the body's shape, admits the
//     event if the partner's backlog is under its bound (else 429 with
//     Retry-After, for that partner only), commits one short transaction,
//     answers 202 with the event's ID. Nothing slow runs in the request.
//   - the relay (package db/outbox): reads pending outbox rows and runs them
//     on keysched with the partner as the key: one partner's events one at
//     a time in order, partners in parallel on one bounded worker pool.
//     Failed attempts are retried with exponential backoff and full jitter
//     (local refusals, Refused, run again later without spending one);
//     after the last attempt the partner is parked: its later events wait,
//     none is dropped, until an operator resumes or skips it.
//   - delivery (Deliverer): one POST per attempt to the endpoint, through the
//     destination's bulkhead (a concurrency budget: a hanging endpoint holds
//     only its own share of the pool), token bucket (rate) and circuit
//     breaker, with a timeout. Every delivery carries the Standard Webhooks
//     headers (webhook-id, the same on every attempt: delivery is
//     at-least-once and customers deduplicate on it; webhook-timestamp;
//     webhook-signature, one per secret of the partner: package signing).
//     What the answer means (retry, wait for its Retry-After, give the
//     event up, park the partner whose endpoint is gone) is Classify's.
//   - operators: an HTML page listing partners by backlog and by the age of
//     their oldest undelivered event, with Resume and Skip for parked ones;
//     OpenTelemetry metrics per partner and the scheduler's own.
package service

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/examples/webhook/signing"
	"github.com/keysched/keysched/otelkeysched"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Sentinel errors.
var (
	// ErrInvalidConfig is wrapped by every error New returns for a bad Config.
	ErrInvalidConfig = errors.New("webhook: invalid config")
	// ErrNotParked is returned by Resume and Skip for a partner that is not
	// parked.
	ErrNotParked = errors.New("webhook: partner is not parked")
	// ErrHeadChanged is wrapped by Skip's error when the partner's parked
	// head is no longer the event given (it was resumed, skipped or
	// replayed meanwhile, and a later event may have parked the partner
	// since): nothing was skipped. The error names the current head. The
	// admin API answers 409 with it.
	ErrHeadChanged = errors.New("webhook: the partner's parked head is another event")
	// ErrClosed is returned by calls made after Close.
	ErrClosed = errors.New("webhook: service closed")
	// ErrZeroService is returned by the methods of a nil or zero Service
	// (one not made by New) that return an error; its handlers answer 500
	// with it.
	ErrZeroService = errors.New("webhook: nil or zero Service (make one with New)")
	// ErrZeroDeliverer is returned by Deliver on a nil or zero Deliverer
	// (one not made by NewDeliverer); its other methods return zero values.
	ErrZeroDeliverer = errors.New("webhook: nil or zero Deliverer (make one with NewDeliverer)")
	// ErrZeroStore is returned by Close on a nil or zero Store (one not
	// made by NewStore, OpenSQLite or OpenPostgres); Outbox returns nil.
	ErrZeroStore = errors.New("webhook: nil or zero Store (make one with NewStore, OpenSQLite or OpenPostgres)")
	// ErrUnconfiguredPartner is returned by New when the store holds
	// undelivered (pending or parked) events of a partner that is not in
	// Config.Partners; the error names each such partner and its count.
	// Add the partner back, or set Config.SkipUnconfigured.
	ErrUnconfiguredPartner = errors.New("webhook: undelivered events of partners not in the configuration")
)

// Config configures New. Zero fields take the defaults documented on each.
//
// Fields meet as keysched.Option says: of two bounds given, the outer one
// applies (a Limits.Concurrency above Workers never runs more than Workers
// calls at once; a PollInterval above a third of LeaseDuration is lowered
// to that third); a default gives way to a value given (LeaseDuration's
// default grows with Timeout and PollInterval); LeaseDuration below twice
// Timeout plus a second is refused. A Retry policy keysched refuses makes New fail with
// ErrInvalidConfig and the *keysched.OptionError (errors.As).
type Config struct {
	// Partners maps each partner (the scheduler key; 1 to 64 characters of
	// letters, digits and ._-) to its customer endpoint URL. Required.
	Partners map[string]string
	// Secrets maps every partner to its Standard Webhooks signing secrets,
	// in the "whsec_" form (package signing: base64 of 24 to 64 random
	// bytes), the current one first. Every request carries one signature
	// per secret: during a rotation give the new and the old one, until the
	// receiver has switched. Required for every partner; a missing or
	// malformed secret is an ErrInvalidConfig (naming the partner, never
	// the secret).
	Secrets map[string][]string
	// MaxBacklog bounds each partner's accepted, undelivered events; at the
	// bound intake answers 429. Default 10,000.
	MaxBacklog int
	// RetryAfter is the Retry-After a 429 carries (rounded up to seconds).
	// Default 5 s.
	RetryAfter time.Duration
	// Workers is the bounded pool all outbound calls run on (keysched's
	// workers). Default 64.
	Workers int
	// Limits applies to every destination (an endpoint's scheme://host:port)
	// unless PerDestination overrides it. Default Concurrency 8, Rate 200/s,
	// Burst 50. PerDestination's keys are "scheme://host[:port]" (the port
	// defaults to the scheme's); a key that is no partner's destination is
	// an ErrInvalidConfig.
	Limits         DestinationLimits
	PerDestination map[string]DestinationLimits
	// Breaker configures each destination's circuit breaker. Default: 5
	// consecutive failures open it for 10 s.
	Breaker BreakerSettings
	// Timeout bounds every HTTP call, dial to end of body. Default 10 s.
	Timeout time.Duration
	// Retry is the retry policy per event; after Retry.MaxAttempts failed
	// attempts the partner is parked. Default 8 attempts, backoff ceiling
	// 250 ms doubling to 30 s, full jitter.
	Retry keysched.RetryPolicy
	// Logger receives operator actions, parks, and errors. Default
	// slog.Default().
	Logger *slog.Logger
	// MeterProvider receives the service's and the scheduler's metrics.
	// Default: none recorded.
	MeterProvider metric.MeterProvider
	// AdminToken, when set, is required on every request to the admin
	// handler (the operator page, its actions, the admin API, /metrics):
	// "Authorization: Bearer <token>", or HTTP Basic authentication with the
	// token as the password (browsers). Missing or wrong, the answer is 401
	// without saying which. At least MinAdminTokenBytes bytes. Empty: no
	// authentication (serve the admin handler on loopback only; the
	// program refuses to start otherwise).
	AdminToken string
	// MetricsHandler, when set, is served at /metrics on the admin handler
	// (see NewPrometheus).
	MetricsHandler http.Handler
	// Store is the database the outbox and intake records live in.
	// Required.
	Store *Store
	// PollInterval is how often the relay looks for new outbox rows when
	// it is idle (on PostgreSQL a NOTIFY wakes it sooner). Default 50 ms.
	PollInterval time.Duration
	// RelayName names this process's relay in the outbox's lease table.
	// A process restarted under the same name takes its keys back at once
	// (after a crash, another name waits for the leases to expire;
	// outbox.WithTakeOverOnStart). Two processes sharing a PostgreSQL
	// database need different names: a second live process of the same
	// name fences the first out of its partners, at the cost of a window in
	// which both publish a partner's events, out of order (see
	// outbox.WithTakeOverOnStart).
	// Default "webhook".
	RelayName string
	// MaxRetryAfter caps the wait a 429 or 503 answer's Retry-After asks
	// for (a longer one is cut to it; the event is tried then). Such a wait
	// spends no attempt. Default DefaultMaxRetryAfter (10 minutes).
	MaxRetryAfter time.Duration
	// BacklogSync is how often this instance re-reads every partner's
	// undelivered events from the database into its in-memory backlog (the
	// count the intake's 429 reads, the operator page's backlog and oldest
	// age). Required when several instances share one database (each one
	// delivers events the others accepted: without it an instance's count
	// only grows, until it answers 429 for ever); each read costs one query
	// returning every undelivered event's ID. 0 (the default): never (one
	// instance). See the README's "Several instances".
	BacklogSync time.Duration
	// LeaseDuration is how long the relay's claim on a partner lasts
	// without renewal (renewed every third of it): after a crash, the
	// partners of the dead process are taken over after at most this long.
	// It must be at least 2 × (Timeout + 1 s) (below, New fails). Default
	// max(30 s, 3 × Timeout, 3 × PollInterval); a PollInterval above a
	// third of a LeaseDuration given is lowered to that third.
	LeaseDuration time.Duration
	// History is how long the service keeps each event's delivery
	// history: its recorded attempts (the attempt table) and its delivered
	// outbox row (the payload a replay sends again; outbox.WithRetention).
	// After it, an event's lookup still shows its partner, type, intake
	// time and state, without attempts, and it can no longer be replayed.
	// A cleanup deletes what is older every History/10 (at most every 10
	// minutes, at least every second). Default 7 days; at least a minute.
	History time.Duration
	// SkipUnconfigured makes New mark skipped (kept in the outbox, not
	// delivered, logged per partner with the count) the undelivered events
	// of partners not in Partners. False (the default): New refuses to
	// start with ErrUnconfiguredPartner while any is left.
	SkipUnconfigured bool

	now        func() time.Time // tests
	trendEvery time.Duration    // tests: the backlog trend's sampling period
}

func (c *Config) defaults() error {
	if len(c.Partners) == 0 {
		return fmt.Errorf("%w: no partners", ErrInvalidConfig)
	}
	for p := range c.Partners {
		if !partnerRe.MatchString(p) {
			return fmt.Errorf("%w: partner name %q: need 1 to 64 of [A-Za-z0-9._-]", ErrInvalidConfig, p)
		}
	}
	for p := range c.Partners {
		if len(c.Secrets[p]) == 0 {
			return fmt.Errorf("%w: partner %q has no signing secret: add its \"whsec_...\" secret to Config.Secrets (the program: a line '%s whsec_...' in -secrets-file)", ErrInvalidConfig, p, p)
		}
		for i, raw := range c.Secrets[p] {
			if _, err := signing.ParseSecret(raw); err != nil {
				return fmt.Errorf("%w: Config.Secrets, partner %q, secret %d: %w", ErrInvalidConfig, p, i+1, err)
			}
		}
	}
	for p := range c.Secrets {
		if _, ok := c.Partners[p]; !ok {
			return fmt.Errorf("%w: Config.Secrets has secrets for %q, which is not in Config.Partners: to remove the partner, remove its secrets too (the program ignores, with a warning, a -secrets-file's partners not configured); a removed partner's undelivered events still refuse the start (ErrUnconfiguredPartner)", ErrInvalidConfig, p)
		}
	}
	if c.Store == nil {
		return fmt.Errorf("%w: nil Store", ErrInvalidConfig)
	}
	if c.MaxBacklog == 0 {
		c.MaxBacklog = 10000
	}
	if c.MaxBacklog < 1 {
		return fmt.Errorf("%w: MaxBacklog %d", ErrInvalidConfig, c.MaxBacklog)
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = 5 * time.Second
	}
	if c.Workers == 0 {
		c.Workers = 64
	}
	if c.Limits == (DestinationLimits{}) {
		c.Limits = DestinationLimits{Concurrency: 8, Rate: 200, Burst: 50}
	}
	if c.Breaker == (BreakerSettings{}) {
		c.Breaker = BreakerSettings{Failures: 5, OpenFor: 10 * time.Second}
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Retry == (keysched.RetryPolicy{}) {
		c.Retry = keysched.RetryPolicy{MaxAttempts: 8, InitialBackoff: 250 * time.Millisecond, MaxBackoff: 30 * time.Second}
	}
	if c.Retry.MaxAttempts < 1 {
		return fmt.Errorf("%w: Retry.MaxAttempts %d: need >= 1", ErrInvalidConfig, c.Retry.MaxAttempts)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.PollInterval == 0 {
		c.PollInterval = 50 * time.Millisecond
	}
	if c.PollInterval < 0 {
		return fmt.Errorf("%w: PollInterval %v", ErrInvalidConfig, c.PollInterval)
	}
	if c.AdminToken != "" && len(c.AdminToken) < MinAdminTokenBytes {
		return fmt.Errorf("%w: AdminToken of %d bytes: need at least %d", ErrInvalidConfig, len(c.AdminToken), MinAdminTokenBytes)
	}
	if c.BacklogSync < 0 {
		return fmt.Errorf("%w: BacklogSync %v", ErrInvalidConfig, c.BacklogSync)
	}
	if c.MaxRetryAfter == 0 {
		c.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if c.MaxRetryAfter < 0 {
		return fmt.Errorf("%w: MaxRetryAfter %v", ErrInvalidConfig, c.MaxRetryAfter)
	}
	if c.RelayName == "" {
		c.RelayName = "webhook"
	}
	if c.LeaseDuration == 0 {
		// The default gives way to what was given (keysched.Option's rule):
		// a PollInterval above a third of it raises it.
		c.LeaseDuration = max(30*time.Second, 3*c.Timeout, 3*c.PollInterval)
	}
	// The relay bounds each call by Timeout plus a second (the rate
	// token's wait) and needs a lease of at least twice that bound
	// (outbox.WithSinkTimeout): a call may start with two thirds of its
	// key's lease left, and its context ends with the lease.
	if least := 2 * (c.Timeout + time.Second); c.LeaseDuration < least {
		return fmt.Errorf("%w: LeaseDuration %v must be at least twice Timeout plus a second (%v): a delivery's context ends with its partner's lease", ErrInvalidConfig, c.LeaseDuration, least)
	}
	if c.History == 0 {
		c.History = 7 * 24 * time.Hour
	}
	if c.History < time.Minute {
		return fmt.Errorf("%w: History %v: need at least a minute", ErrInvalidConfig, c.History)
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.trendEvery == 0 {
		c.trendEvery = trendEvery
	}
	return nil
}

// Service is the running webhook delivery service. Create it with New, serve
// IntakeHandler and AdminHandler, stop it with Close.
//
// The zero Service is not usable: use New. The methods of a nil or zero
// Service return ErrZeroService (those with an error result); its
// IntakeHandler and AdminHandler answer every request with 500 and
// ErrZeroService's text (not nil: http.Server would serve
// http.DefaultServeMux in place of a nil Handler).
type Service struct {
	beforeRequeue func() // tests: runs just before a replay writes its new deliveries
	cfg           Config
	log           *slog.Logger
	now           func() time.Time
	partners      []string
	backlog       *backlog
	deliver       *Deliverer
	metrics       *metrics
	store         *Store
	relay         *relay
	schedMet      *otelkeysched.Metrics[string]
	commit        *committer
	history       *history
	// markFault, for tests, runs in every mark transaction, after the
	// delivered attempts' inserts (markhook.go): an error fails the hook.
	markFault atomic.Pointer[func(context.Context, *sql.Tx) error]
	trend     *trend
	bgStop    chan struct{}
	bgDone    []chan struct{}
	// bgCtx bounds the unknown outcomes' reads (unknown.go): Close cancels
	// it, so that it does not wait out a read of a database that hangs.
	bgCtx    context.Context
	bgCancel context.CancelFunc

	syncStop, syncDone chan struct{} // backlog sync (BacklogSync > 0)

	// The watchers of unknown outcomes (unknown.go).
	unknownMu        sync.Mutex
	unknown          sync.WaitGroup
	unknownReplayFor time.Duration

	closeOnce sync.Once
	closeErr  error
	closed    atomic.Bool
}

// New checks cfg, loads the undelivered events from the store (a restart
// picks up where the last process stopped), and starts delivering.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, log: cfg.Logger, now: cfg.now, store: cfg.Store, unknownReplayFor: unknownReplayFor}
	for p := range cfg.Partners {
		s.partners = append(s.partners, p)
	}
	slices.Sort(s.partners)
	s.backlog = newBacklog(cfg.MaxBacklog, s.partners)
	secrets := map[string][]signing.Secret{}
	for p, raws := range cfg.Secrets {
		for _, raw := range raws {
			sec, _ := signing.ParseSecret(raw) // checked by defaults
			secrets[p] = append(secrets[p], sec)
		}
	}
	d, err := NewDeliverer(DelivererConfig{
		Endpoints: cfg.Partners, Secrets: secrets, Limits: cfg.Limits, PerDestination: cfg.PerDestination,
		Breaker: cfg.Breaker, Timeout: cfg.Timeout, MaxRetryAfter: cfg.MaxRetryAfter,
		OnBreakerState: func(dest string, from, to gobreaker.State) {
			s.log.Warn("circuit breaker", "destination", dest, "from", from.String(), "to", to.String())
		},
	})
	if err != nil {
		return nil, err
	}
	s.deliver = d
	if s.metrics, err = newMetrics(cfg.MeterProvider); err != nil {
		return nil, fmt.Errorf("webhook: metrics: %w", err)
	}
	if err := s.checkUnconfigured(ctx); err != nil {
		_ = s.metrics.close()
		return nil, err
	}
	if err := s.store.loadPending(ctx, s.backlog); err != nil {
		_ = s.metrics.close()
		return nil, err
	}
	var observe []keysched.Option
	if cfg.MeterProvider != nil {
		// The relay's scheduler (package otelkeysched, issue 11): pending
		// and running deliveries, live and parked keys, outcomes, retries,
		// and, through its Observer given to the relay's scheduler, the
		// queue wait and attempt duration histograms and the oldest task's
		// age (the Observer implies keysched.WithTaskAges). Keys are never
		// attribute values there.
		if s.schedMet, err = otelkeysched.New[string](cfg.MeterProvider,
			otelkeysched.WithAttributes(attribute.String("scheduler", "webhook.delivery"))); err != nil {
			_ = s.metrics.close()
			return nil, fmt.Errorf("webhook: scheduler metrics: %w", err)
		}
		observe = append(observe, keysched.WithObserver(s.schedMet.Observer()))
	}
	// Before the relay: its deliveries record their attempts.
	s.history = newHistory(s.store)
	if s.relay, err = startRelay(ctx, s, observe...); err != nil {
		s.history.close()
		_ = s.metrics.close()
		if s.schedMet != nil {
			_ = s.schedMet.Unregister()
		}
		return nil, err
	}
	s.commit = newCommitter(s.store, s.settleIntake)
	s.trend = newTrend(s.partners)
	s.bgStop = make(chan struct{})
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	s.bgDone = []chan struct{}{make(chan struct{}), make(chan struct{})}
	go s.cleaner(s.bgStop, s.bgDone[0])
	go s.sampler(s.bgStop, s.bgDone[1])
	if cfg.BacklogSync > 0 {
		s.syncStop, s.syncDone = make(chan struct{}), make(chan struct{})
		go s.syncBacklog(cfg.BacklogSync, s.syncStop, s.syncDone)
	}
	// Last: from here on a collection may read the whole service.
	if err := s.metrics.observe(s); err != nil {
		_ = s.Close(context.Background())
		return nil, fmt.Errorf("webhook: metrics: %w", err)
	}
	if s.schedMet != nil {
		if err := s.schedMet.Register(s.relay.scheduler()); err != nil {
			_ = s.Close(context.Background())
			return nil, fmt.Errorf("webhook: scheduler metrics: %w", err)
		}
	}
	return s, nil
}

// zero reports a nil Service or one not made by New.
func (s *Service) zero() bool { return s == nil || s.commit == nil }

// zeroHandler answers every request of a nil or zero Service.
var zeroHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, ErrZeroService.Error(), http.StatusInternalServerError)
})

func (s *Service) known(partner string) bool {
	_, ok := slices.BinarySearch(s.partners, partner)
	return ok
}

// IntakeHandler serves POST /events/{partner}.
func (s *Service) IntakeHandler() http.Handler {
	if s.zero() {
		return zeroHandler
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /events/{partner}", s.handleIntake)
	return mux
}

// AdminHandler serves the operator page (GET /), the operator actions (POST
// /partners/{partner}/resume and /skip, each logged), the event lookup and
// replay (GET /events/{id}, POST /events/{id}/replay and
// /partners/{partner}/replay, the pages under /ui/: see events_http.go) and, when
// Config.MetricsHandler is set, /metrics. With Config.AdminToken set, every
// request needs the token (401 otherwise); without, it has no
// authentication: serve it on loopback only.
//
// The actions refuse cross-origin requests (403, net/http's
// CrossOriginProtection, from the Sec-Fetch-Site and Origin headers): being
// on loopback or an internal network is no protection against a page on
// another site, opened in the operator's browser, posting a form to
// /partners/{partner}/skip (cross-site request forgery: an event given up).
// Requests without those headers (curl, scripts) are let through.
func (s *Service) AdminHandler() http.Handler {
	if s.zero() {
		return zeroHandler
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.handleOperatorPage)
	mux.HandleFunc("POST /partners/{partner}/{action}", s.handleOperatorAction)
	s.routeEvents(mux) // events_http.go: lookup and replay
	if s.cfg.MetricsHandler != nil {
		mux.Handle("GET /metrics", s.cfg.MetricsHandler)
	}
	h := http.NewCrossOriginProtection().Handler(mux)
	if s.cfg.AdminToken != "" {
		h = requireToken(s.cfg.AdminToken, h) // adminauth.go
	}
	return h
}

// Status returns every partner's backlog, age of its oldest undelivered
// event, parked state (with the parked head's ID, which Skip takes) and
// counters, sorted by backlog then age, largest first. It costs a walk of
// the partners (in memory) and one indexed query for the parked partners'
// heads.
func (s *Service) Status(ctx context.Context) ([]PartnerStatus, error) {
	if s.zero() {
		return nil, ErrZeroService
	}
	out := s.backlog.snapshot(s.now())
	heads, err := s.store.parkedHeads(ctx)
	if err != nil {
		return nil, fmt.Errorf("webhook: parked partners: %w", err)
	}
	for i := range out {
		if h, ok := heads[out[i].Partner]; ok {
			out[i].Parked, out[i].Head, out[i].HeadEvent = true, h.row, h.event
		}
		out[i].Destination = s.deliver.Destination(out[i].Partner)
		if st, ok := s.deliver.BreakerState(out[i].Destination); ok {
			out[i].Breaker = st.String()
		}
	}
	return out, nil
}

// Parked returns the parked partners, sorted: those whose head event ran out
// of attempts (it is kept in the database, with its error, as a dead outbox
// row), in this process or an earlier one.
func (s *Service) Parked(ctx context.Context) ([]string, error) {
	if s.zero() {
		return nil, ErrZeroService
	}
	p, err := s.relay.parked(ctx)
	if err != nil {
		return nil, fmt.Errorf("webhook: parked partners: %w", err)
	}
	slices.Sort(p)
	return p, nil
}

// Resume retries a parked partner's head event with a fresh attempt budget;
// its later events follow in order. ErrNotParked if it is not parked,
// ErrClosed after Close. The action is logged.
func (s *Service) Resume(ctx context.Context, partner string) error {
	if s.zero() {
		return ErrZeroService
	}
	if s.closed.Load() {
		return ErrClosed
	}
	if err := s.relay.resume(ctx, partner); err != nil {
		return err
	}
	s.log.Info("operator resumed partner", "partner", partner)
	return nil
}

// Skip gives up a parked partner's head event (it is not delivered; the
// store keeps it marked as skipped) and lets its later events go on, only
// if the head is still head, the ID the operator saw: PartnerStatus.Head
// (the event's ID, or a replay's delivery ID when the head is a replay). The
// check and the move are one statement (outbox.SkipEvent): a head resumed
// and delivered after the operator looked, with a later event parked
// since, is never given up in its place.
//
// A parked replay's head is its delivery ID, never the replayed event's
// ID: Skip with the event's ID is refused (ErrHeadChanged, saying the head
// is a replay of it and which ID to send), as taking it could give up
// another replay of the event than the one seen.
//
// Errors: ErrHeadChanged (wrapped, naming the current head) when the head
// is another event, nothing skipped; ErrNotParked when the partner is not
// parked; ErrUnknownEvent for an empty head or an ID no event can have;
// ErrClosed after Close; an error wrapping outbox.ErrOutcomeUnknown when
// the database connection broke, or ctx ended, while the move was in
// flight: it may have been skipped. Calling Skip again with the same head
// is then safe (it skips nothing more: ErrHeadChanged or ErrNotParked if
// the first took effect). After such an outcome the service reads the
// event's state until it is known (at once, then every second while the
// event is still parked, until Close) and, if it was skipped, takes it off
// the partner's backlog and counts it then. The action is logged with the
// event's ID. Safe for concurrent use: of concurrent Skips of one head, one
// gives it up.
func (s *Service) Skip(ctx context.Context, partner, head string) error {
	if s.zero() {
		return ErrZeroService
	}
	if s.closed.Load() {
		return ErrClosed
	}
	if head == "" {
		return fmt.Errorf("%w: the empty ID: Skip needs the ID of the parked head event (PartnerStatus.Head)", ErrUnknownEvent)
	}
	if err := checkEventID(head); err != nil {
		return err
	}
	err := s.relay.skip(ctx, partner, head)
	if errors.Is(err, outbox.ErrOutcomeUnknown) {
		s.log.Warn("operator skip: outcome unknown (the event may have been skipped); its state is read until known", "partner", partner, "event", head, "err", err)
		s.settleUnknownSkip(partner, head)
	}
	if err != nil {
		return err
	}
	s.skipped(partner, head)
	return nil
}

// skipped takes a skipped event off the partner's backlog, counts it and
// logs it.
func (s *Service) skipped(partner, id string) {
	s.backlog.done(partner, id, false)
	s.metrics.settled(context.Background(), partner)
	s.log.Warn("operator skipped an event", "partner", partner, "event", id)
}

// Close stops delivering: it lets the attempts in flight finish until ctx
// ends, then cancels them; every undelivered event stays in the database
// for the next start. It returns ctx's error if ctx ended first. Close does
// not close the Store. Call it once the intake handler is no longer served.
func (s *Service) Close(ctx context.Context) error {
	if s.zero() {
		return ErrZeroService
	}
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		var unreg error
		if s.schedMet != nil {
			unreg = s.schedMet.Unregister()
		}
		if s.syncStop != nil {
			close(s.syncStop)
			<-s.syncDone
		}
		s.commit.close()
		close(s.bgStop)
		s.bgCancel()
		for _, d := range s.bgDone {
			<-d
		}
		s.waitUnknown()
		s.closeErr = errors.Join(s.relay.close(ctx), s.metrics.close(), unreg)
		// After the relay: the attempts in flight at Close are recorded.
		s.history.close()
		s.deliver.Close()
	})
	return s.closeErr
}

// settleIntake ends an admitted event's bookkeeping with its transaction's
// outcome (the event entered the backlog before its transaction began).
func (s *Service) settleIntake(env Envelope, err error) {
	s.backlog.settled(env.ID)
	if err != nil {
		s.backlog.drop(env.Partner, env.ID)
		return
	}
	s.metrics.accepted(context.Background(), env.Partner)
	s.metrics.enqueued(context.Background(), env.Partner, 1)
}

// sink is the relay's publish function: one delivery attempt of the row e
// (an event's own row, or a replay's: see webhookID).
//
// A local refusal (Refused: bulkhead full, breaker open, no rate token) made
// no call, so it is no attempt: it is returned wrapped in keysched.Snooze,
// which runs the event again after the retry policy's first delay (full
// jitter on [0, Retry.InitialBackoff]) without spending Retry.MaxAttempts,
// and it counts as "refused", not as a failed attempt; it is not recorded in
// the history either. The partner keeps its order meanwhile. Refusals are
// bounded where they come from: the bulkhead frees as calls in flight end
// (each within Timeout), the token bucket refills, an open breaker
// half-opens after OpenFor and lets one counted call through.
//
// Every other attempt is recorded. A delivered one (a 2xx) is handed to the
// outbox's mark (outbox.SetMarkNote) and recorded in the transaction that
// marks the row sent (markhook.go): on record if and only if the row is
// marked; the backlog and the delivery counters follow that commit. A
// failed one is recorded (history.go) before the sink returns, so before
// the outbox can mark the row dead: a dead row always has its attempts on
// record. A failed attempt that cannot be recorded is returned as a plain
// failure (retried, never Permanent nor a Retry-After snooze: the row is
// not marked dead without its attempt on record), and the error is logged.
func (s *Service) sink(ctx context.Context, e outbox.Event) error {
	partner := e.Key
	id, replay := webhookID(e)
	var out Call
	err := s.deliver.Deliver(ctx, Delivery{Partner: partner, ID: id, Received: e.CreatedAt, Body: e.Payload, Call: &out})
	if err != nil && Refused(err) {
		s.metrics.refused(ctx, partner)
		return keysched.Snooze(err, 0)
	}
	rec := &attemptRec{eventID: id, rowID: e.ID, partner: partner, replay: replay, received: e.CreatedAt, a: Attempt{
		At: out.Start, Duration: out.Duration, Status: out.Status, Body: text(out.Body), Relay: s.cfg.RelayName,
	}}
	if !out.Called {
		rec.a.At = s.now()
	}
	if err == nil {
		// Recorded, and counted, with the row's mark (markhook.go).
		outbox.SetMarkNote(ctx, rec)
		return nil
	}
	rec.a.Error = err.Error()
	if rerr := s.history.record(rec); rerr != nil {
		s.log.Error("recording a failed delivery attempt failed: retried as a plain failure", "partner", partner, "event", id, "err", rerr)
		s.backlog.failedAttempt(partner, err)
		s.metrics.failed(ctx, partner)
		return err
	}
	// What the answer means (response.go): a retry, a Retry-After
	// snooze, or a final refusal.
	return s.forRelay(ctx, partner, id, err)
}

// onPark is called when a partner's head event ran out of attempts.
func (s *Service) onPark(partner, id string, attempts int, err string) {
	s.backlog.parked(partner)
	s.metrics.parked(context.Background(), partner)
	s.log.Warn("partner parked: its later events wait until an operator presses Resume (retries this event) or Skip (gives it up) on the operator page, or POSTs /partners/{partner}/resume or /skip with event={event}", "partner", partner, "event", id, "attempts", attempts, "err", err)
}
