package otelkeysched

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/optcheck"
	"github.com/keysched/keysched/internal/opterror"
)

// ScopeName is the instrumentation scope (the Meter's name) of every
// instrument this package makes.
const ScopeName = "github.com/keysched/keysched/otelkeysched"

// Metric names. Units follow UCUM ("s"), counts are annotated ("{task}").
const (
	TasksPending      = "keysched.tasks.pending"       // UpDownCounter {task}: accepted, unfinished tasks (Stats.Pending)
	TasksRunning      = "keysched.tasks.running"       // UpDownCounter {task}: attempts running now
	KeysLive          = "keysched.keys.live"           // UpDownCounter {key}: keys with queued or running tasks
	KeysParked        = "keysched.keys.parked"         // UpDownCounter {key}: parked keys (FailurePolicy Park)
	TasksFinished     = "keysched.tasks.finished"      // Counter {task}, attribute outcome
	TasksRetried      = "keysched.tasks.retried"       // Counter {retry}: retries scheduled (attempts after the first)
	TasksSnoozed      = "keysched.tasks.snoozed"       // Counter {run}: runs that returned keysched.Snooze (not attempts)
	TasksDeadLettered = "keysched.tasks.dead_lettered" // Counter {task}: dead letters delivered (or logged)
	TasksRejected     = "keysched.tasks.rejected"      // Counter {task}: Submit and TrySubmit calls that failed
	TaskQueueWait     = "keysched.task.queue_wait"     // Histogram s: acceptance to first start, attribute-free but for the constant ones
	TaskDuration      = "keysched.task.duration"       // Histogram s: one attempt's run, attribute outcome (succeeded, failed, panicked, snoozed)
	TasksOldestAge    = "keysched.tasks.oldest_age"    // Gauge s: age of the oldest unfinished task
)

// Attribute keys this package sets itself. WithAttributes refuses them.
const (
	// OutcomeKey is the attribute of keysched.tasks.finished (succeeded,
	// failed, panicked, cancelled, aborted) and keysched.task.duration
	// (succeeded, failed, panicked, snoozed: the run's; a snoozed run, see
	// keysched.Snooze, is no attempt and no failure).
	OutcomeKey = attribute.Key("outcome")
	// SubscriptionKey names a bus subscriber (RegisterSubscription).
	SubscriptionKey = attribute.Key("subscription")
)

// Outcome attribute values.
const (
	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
	OutcomePanicked  = "panicked"
	OutcomeCancelled = "cancelled"
	OutcomeAborted   = "aborted"
	OutcomeSnoozed   = "snoozed" // keysched.task.duration only
)

// DefaultBuckets are the histograms' bucket boundaries, in seconds: from
// 100 µs (a handler's quick path) to 5 minutes (a backlog's queue wait).
// Change them with an SDK View.
var DefaultBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
	0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
}

// ErrRegistered is returned by Register on a Metrics that already has a
// scheduler, and ErrUnregistered once Unregister was called.
//
// ErrZeroMetrics is returned by the methods of a nil or zero Metrics (one
// not made by New) that return an error, and ErrZeroRegistration by
// Unregister on a nil or zero Registration (one not returned by
// RegisterSubscription or RegisterBus).
var (
	ErrRegistered       = errors.New("otelkeysched: a scheduler is already registered")
	ErrUnregistered     = errors.New("otelkeysched: unregistered")
	ErrZeroMetrics      = errors.New("otelkeysched: nil or zero Metrics (make one with New)")
	ErrZeroRegistration = errors.New("otelkeysched: nil or zero Registration (get one from RegisterSubscription or RegisterBus)")
)

// An Option configures New, RegisterSubscription and RegisterBus. A bad one
// makes them fail with an error wrapping a *keysched.OptionError that names
// it ("otelkeysched: ..."; errors.Is matches keysched.ErrInvalidOption), as
// every keysched module refuses an option. Options meet by keysched.Option's
// rule, the one rule of every keysched module (see its "How options meet"):
// the last ForSubscription wins; WithAttributes add up.
type Option func(*config) error

// refused is the error of a refused option: r's *keysched.OptionError,
// wrapped "otelkeysched: ..."; nil for a nil r.
func refused(r *optcheck.Refusal) error {
	if r == nil {
		return nil
	}
	return fmt.Errorf("otelkeysched: %w", opterror.New(nil, r))
}

type config struct {
	attrs        []attribute.KeyValue
	subscription string // ForSubscription
}

// WithAttributes adds constant attributes to every measurement, so that
// several schedulers (or buses) reporting to one MeterProvider can be told
// apart: for example attribute.String("scheduler", "ledger"). Never put a key
// (an account or user id) here: attributes must have a small, bounded set of
// values. The keys "outcome" and "subscription" are this package's own and
// are refused, as are invalid attributes.
func WithAttributes(kv ...attribute.KeyValue) Option {
	return func(c *config) error {
		for _, a := range kv {
			if !a.Valid() {
				return refused(optcheck.Refuse("WithAttributes", strconv.Quote(string(a.Key)), "invalid attribute"))
			}
			if a.Key == OutcomeKey || a.Key == SubscriptionKey {
				return refused(optcheck.Refuse("WithAttributes", strconv.Quote(string(a.Key)), "the key is set by otelkeysched"))
			}
		}
		c.attrs = append(c.attrs, kv...)
		return nil
	}
}

// ForSubscription makes New's Metrics those of the bus subscription named
// name: every measurement, the histograms' included, carries the attribute
// subscription=name, and Metrics.RegisterSubscription registers that
// subscription. Give the Metrics' Observer to bus.Subscribe with
// bus.Observe.
func ForSubscription(name string) Option {
	return func(c *config) error {
		if r := optcheck.Text("ForSubscription", name, 0); r != nil {
			return refused(r)
		}
		c.subscription = name
		return nil
	}
}

func newConfig(mp metric.MeterProvider, opts []Option) (config, error) {
	var cfg config
	if mp == nil {
		return cfg, fmt.Errorf("%w: otelkeysched: nil MeterProvider", keysched.ErrInvalidOption)
	}
	for i, o := range opts {
		if o == nil {
			return cfg, refused(optcheck.NilOption(i, "Option"))
		}
		if err := o(&cfg); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// instruments are the scheduler instruments, shared by Metrics and the bus.
type instruments struct {
	pending, running, keys, parked       metric.Int64ObservableUpDownCounter
	finished, retried, dead, rejected    metric.Int64ObservableCounter
	snoozed                              metric.Int64ObservableCounter
	oldest                               metric.Float64ObservableGauge
	queueWait, duration                  metric.Float64Histogram
	observables                          []metric.Observable
	dropped, skipped, ejectedEv, ejected metric.Int64Observable // bus only
}

func newInstruments(meter metric.Meter, bus bool) (*instruments, error) {
	var in instruments
	var errs []error
	upDown := func(name, unit, desc string) metric.Int64ObservableUpDownCounter {
		i, err := meter.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		in.observables = append(in.observables, i)
		return i
	}
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		i, err := meter.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		in.observables = append(in.observables, i)
		return i
	}
	in.pending = upDown(TasksPending, "{task}", "Accepted tasks not yet finished: queued, running, waiting out a retry backoff, or parked.")
	in.running = upDown(TasksRunning, "{task}", "Task attempts running now (each holds a worker).")
	in.keys = upDown(KeysLive, "{key}", "Keys with queued or running tasks.")
	in.parked = upDown(KeysParked, "{key}", "Keys parked after a failure (FailurePolicy Park), waiting for Resume or Skip.")
	in.finished = counter(TasksFinished, "{task}", "Tasks that reached their terminal outcome, by outcome.")
	in.retried = counter(TasksRetried, "{retry}", "Retries scheduled (attempts after the first).")
	in.snoozed = counter(TasksSnoozed, "{run}", "Runs that returned keysched.Snooze: refused before their work, run again without spending an attempt.")
	in.dead = counter(TasksDeadLettered, "{task}", "Tasks delivered to the dead letter (or logged) after failing for good.")
	in.rejected = counter(TasksRejected, "{task}", "Submissions refused (full, closed, invalid, context ended).")
	var err error
	in.oldest, err = meter.Float64ObservableGauge(TasksOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unfinished task (queued, running, retrying or parked), since it was accepted; 0 when none is."))
	errs = append(errs, err)
	in.observables = append(in.observables, in.oldest)
	if bus {
		in.dropped = counter(BusEventsDropped, "{event}", "Events a subscriber dropped (OnFull(DropNewest)).")
		in.skipped = counter(BusEventsSkipped, "{event}", "Events not offered to a subscriber because it was ejected.")
		in.ejectedEv = counter(BusEventsEjected, "{event}", "Events dead-lettered with ErrEjected without their handler running.")
		in.ejected = upDown(BusSubscriptionsEjected, "{subscription}", "Subscriptions ejected (EjectAfter): 1 for an ejected one, else 0.")
	}
	in.queueWait, err = meter.Float64Histogram(TaskQueueWait, metric.WithUnit("s"),
		metric.WithDescription("Time from a task's acceptance to the start of its first attempt."),
		metric.WithExplicitBucketBoundaries(DefaultBuckets...))
	errs = append(errs, err)
	in.duration, err = meter.Float64Histogram(TaskDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of one attempt of a task, by the attempt's outcome."),
		metric.WithExplicitBucketBoundaries(DefaultBuckets...))
	errs = append(errs, err)
	return &in, errors.Join(errs...)
}

// observeStats reports a scheduler's (or a subscriber's) counters with the
// attributes base, plus its oldest task's age when age >= 0.
func (in *instruments) observeStats(o metric.Observer, st keysched.Stats, base []attribute.KeyValue, age float64) {
	opt := metric.WithAttributeSet(attribute.NewSet(base...))
	o.ObserveInt64(in.pending, int64(st.Pending), opt)
	o.ObserveInt64(in.running, int64(st.Running), opt)
	o.ObserveInt64(in.keys, int64(st.Keys), opt)
	o.ObserveInt64(in.parked, int64(st.ParkedKeys), opt)
	for _, oc := range []struct {
		name string
		n    uint64
	}{
		{OutcomeSucceeded, st.Succeeded}, {OutcomeFailed, st.Failed}, {OutcomePanicked, st.Panicked},
		{OutcomeCancelled, st.Cancelled}, {OutcomeAborted, st.Aborted},
	} {
		o.ObserveInt64(in.finished, int64(oc.n), metric.WithAttributeSet(withKV(base, OutcomeKey.String(oc.name))))
	}
	o.ObserveInt64(in.retried, int64(st.Retried), opt)
	o.ObserveInt64(in.snoozed, int64(st.Snoozed), opt)
	o.ObserveInt64(in.dead, int64(st.DeadLettered), opt)
	o.ObserveInt64(in.rejected, int64(st.Rejected), opt)
	if age >= 0 {
		o.ObserveFloat64(in.oldest, age, opt)
	}
}

func withKV(base []attribute.KeyValue, kv ...attribute.KeyValue) attribute.Set {
	return attribute.NewSet(append(append(make([]attribute.KeyValue, 0, len(base)+len(kv)), base...), kv...)...)
}

// Metrics reports one scheduler's metrics to a MeterProvider: its counters
// and the age of its oldest unfinished task, read at each collection
// (asynchronous instruments: nothing is recorded per task), and the queue
// wait and attempt duration histograms, recorded per task by the scheduler's
// Observer.
//
// Use: New, then keysched.New with keysched.WithObserver(m.Observer()), then
// Register with the scheduler; Unregister when done. A scheduler made without
// the observer still reports everything but the two histograms (and an
// oldest age of 0, unless made with keysched.WithTaskAges). For a bus
// subscriber: New with ForSubscription(name), bus.Subscribe with
// bus.Observe(m.Observer()), then RegisterSubscription.
//
// No key is ever an attribute value (unbounded cardinality, personal data):
// per-key detail is keysched.Scheduler.Keys's job. All methods are safe for
// concurrent use.
//
// The zero Metrics is not usable: use New. The methods of a nil or zero
// Metrics return ErrZeroMetrics (those with an error result) or zero values
// (Observer returns the zero keysched.Observer, which observes nothing).
type Metrics[K comparable] struct {
	in           *instruments
	meter        metric.Meter
	attrs        []attribute.KeyValue
	subscription string // ForSubscription's name, or ""

	// Per-measurement options, made once: recording allocates nothing.
	waitOpt []metric.RecordOption
	durOpt  [4][]metric.RecordOption // succeeded, failed, panicked, snoozed

	mu      sync.Mutex
	reg     metric.Registration
	release func() // the claim on (meter, attributes); nil when none
	done    bool
	muted   atomic.Bool // Unregister was called: the observer records nothing
}

// New makes the instruments for one scheduler of keys K on mp's Meter
// ScopeName. Errors: a nil mp or a bad option (wrapping
// keysched.ErrInvalidOption), or the MeterProvider's own.
func New[K comparable](mp metric.MeterProvider, opts ...Option) (*Metrics[K], error) {
	cfg, err := newConfig(mp, opts)
	if err != nil {
		return nil, err
	}
	meter := mp.Meter(ScopeName)
	if cfg.subscription != "" {
		cfg.attrs = append(cfg.attrs, SubscriptionKey.String(cfg.subscription))
	}
	in, err := newInstruments(meter, cfg.subscription != "")
	if err != nil {
		return nil, fmt.Errorf("otelkeysched: %w", err)
	}
	m := &Metrics[K]{in: in, meter: meter, attrs: cfg.attrs, subscription: cfg.subscription}
	m.waitOpt = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(cfg.attrs...))}
	for i, oc := range []string{OutcomeSucceeded, OutcomeFailed, OutcomePanicked, OutcomeSnoozed} {
		m.durOpt[i] = []metric.RecordOption{metric.WithAttributeSet(withKV(cfg.attrs, OutcomeKey.String(oc)))}
	}
	return m, nil
}

// Observer returns the keysched.Observer that records the queue wait (on a
// task's first attempt) and each attempt's duration. Give it to keysched.New
// with keysched.WithObserver. It records nothing once Unregister was called.
// Its cost per task: two monotonic clock reads per attempt and one at
// acceptance (in the scheduler), plus two histogram recordings.
func (m *Metrics[K]) Observer() keysched.Observer[K] {
	if m.zero() {
		return keysched.Observer[K]{}
	}
	return keysched.Observer[K]{
		AttemptStarted: func(_ K, a keysched.AttemptInfo) {
			if a.N == 1 && !m.muted.Load() {
				m.in.queueWait.Record(context.Background(), a.Started.Sub(a.Accepted).Seconds(), m.waitOpt...)
			}
		},
		AttemptEnded: func(_ K, a keysched.AttemptInfo) {
			if m.muted.Load() {
				return
			}
			i := 0
			switch {
			case a.Panicked:
				i = 2
			case a.Err == nil:
			case keysched.IsSnoozed(a.Err) && !keysched.IsPermanent(a.Err):
				i = 3
			default:
				i = 1
			}
			m.in.duration.Record(context.Background(), a.Ended.Sub(a.Started).Seconds(), m.durOpt[i]...)
		},
	}
}

// Register reports s's counters and oldest task's age at every collection,
// under m's attributes, until Unregister. Each collection reads s.Stats and
// s.OldestAge (which walks s's live keys' heads: see
// keysched.Scheduler.OldestAge); the age is 0 unless s was made with the
// Observer (or keysched.WithTaskAges).
//
// Registering s again on the same MeterProvider with the same attributes
// (through another Metrics) is refused with an error wrapping
// ErrRegistered: the SDK would sum the two into one series, every task
// counted twice. (Two different schedulers with the same attributes are
// summed too, which is their total; their oldest ages are then one of the
// two: tell them apart with WithAttributes.)
//
// It returns ErrRegistered if a scheduler is registered already on m, or s
// with m's attributes on its MeterProvider, ErrUnregistered after
// Unregister, or the MeterProvider's error.
func (m *Metrics[K]) Register(s *keysched.Scheduler[K]) error {
	if m.zero() {
		return ErrZeroMetrics
	}
	if s == nil {
		return fmt.Errorf("%w: otelkeysched: Register(nil)", keysched.ErrInvalidOption)
	}
	if m.subscription != "" {
		return fmt.Errorf("%w: otelkeysched: Metrics made ForSubscription(%q) registers a subscription, not a scheduler",
			keysched.ErrInvalidOption, m.subscription)
	}
	return m.register(s, func(_ context.Context, o metric.Observer) error {
		m.in.observeStats(o, s.Stats(), m.attrs, s.OldestAge().Seconds())
		return nil
	})
}

// zero reports a nil Metrics or one not made by New.
func (m *Metrics[K]) zero() bool { return m == nil || m.in == nil }

func (m *Metrics[K]) register(target any, f metric.Callback) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.done:
		return ErrUnregistered
	case m.reg != nil:
		return ErrRegistered
	}
	release, err := claim(m.meter, familyScheduler, target, m.attrs)
	if err != nil {
		return err
	}
	reg, err := m.meter.RegisterCallback(f, m.in.observables...)
	if err != nil {
		release()
		return fmt.Errorf("otelkeysched: %w", err)
	}
	m.reg, m.release = reg, release
	return nil
}

// Unregister stops reporting: the scheduler's series are gone from the next
// collection on (a cumulative exporter keeps the histograms' totals so far),
// and the Observer records nothing more. It is idempotent, and final.
func (m *Metrics[K]) Unregister() error {
	if m.zero() {
		return ErrZeroMetrics
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.muted.Store(true)
	m.done = true
	if m.reg == nil {
		return nil
	}
	reg := m.reg
	m.reg = nil
	m.release()
	if err := reg.Unregister(); err != nil {
		return fmt.Errorf("otelkeysched: %w", err)
	}
	return nil
}
