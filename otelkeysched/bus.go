package otelkeysched

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/bus"
)

// Bus metric names, besides the scheduler's (which a subscription reports
// with the attribute subscription=<its name>).
const (
	BusEventsPublished      = "keysched.bus.events.published"      // Counter {event}: Publish calls past validation
	BusEventsUnmatched      = "keysched.bus.events.unmatched"      // Counter {event}: published events no subscriber matched
	BusSubscriptions        = "keysched.bus.subscriptions"         // UpDownCounter {subscription}: subscribed now
	BusEventsDropped        = "keysched.bus.events.dropped"        // Counter {event}: dropped by OnFull(DropNewest), per subscription
	BusEventsSkipped        = "keysched.bus.events.skipped"        // Counter {event}: not offered to an ejected subscription
	BusEventsEjected        = "keysched.bus.events.ejected"        // Counter {event}: dead-lettered with ErrEjected, per subscription
	BusSubscriptionsEjected = "keysched.bus.subscriptions.ejected" // UpDownCounter {subscription}: 1 for an ejected subscription
)

// A Subscription is what RegisterSubscription reads: a *bus.Subscription
// (whatever its type parameters) has these methods.
type Subscription interface {
	Name() string
	Stats() bus.SubStats
}

// An ObservedSubscription is a Subscription that also reports its oldest
// event's age: a *bus.Subscription[K] has these methods.
type ObservedSubscription interface {
	Subscription
	OldestAge() time.Duration
}

// A Bus is what RegisterBus reads: a *bus.Bus[K] has this method.
type Bus interface {
	Stats() bus.Stats
}

// A Registration stops reporting what RegisterSubscription or RegisterBus
// started.
//
// The zero Registration is not usable: get one from RegisterSubscription or
// RegisterBus. Unregister on a nil or zero Registration returns
// ErrZeroRegistration.
type Registration struct {
	once    sync.Once
	reg     metric.Registration
	release func()
	err     error
}

// Unregister stops reporting: the series are gone from the next collection
// on. It is idempotent (later calls return the first one's result). On a nil
// or zero Registration it returns ErrZeroRegistration.
func (r *Registration) Unregister() error {
	if r == nil || r.reg == nil {
		return ErrZeroRegistration
	}
	r.once.Do(func() {
		r.release()
		if err := r.reg.Unregister(); err != nil {
			r.err = fmt.Errorf("otelkeysched: %w", err)
		}
	})
	return r.err
}

// RegisterSubscription reports a bus subscriber's metrics at every
// collection, from its Stats, with the attribute subscription=<its name>
// (plus those of WithAttributes): the scheduler's instruments (pending,
// running, live and parked keys, finished by outcome, retried, dead-lettered,
// rejected) and keysched.bus.events.dropped, .skipped, .ejected and
// keysched.bus.subscriptions.ejected, and keysched.tasks.oldest_age when sub
// is an ObservedSubscription (a *bus.Subscription[K] is; its ages are 0
// unless it was subscribed with bus.TaskAges or bus.Observe). For the queue
// wait and duration histograms too, use New with ForSubscription and
// Metrics.RegisterSubscription instead.
//
// Unregister the returned Registration when the subscription is gone
// (Unsubscribe); until then its last figures keep being reported.
// Errors: a nil sub (a typed nil *bus.Subscription included), one with an
// empty name (a zero bus.Subscription, not returned by bus.Subscribe) or a
// bad option (wrapping keysched.ErrInvalidOption); ErrRegistered when sub is registered
// already on mp with the same attributes (its series would count twice).
func RegisterSubscription(mp metric.MeterProvider, sub Subscription, opts ...Option) (*Registration, error) {
	if isNil(sub) {
		return nil, fmt.Errorf("%w: otelkeysched: nil Subscription", keysched.ErrInvalidOption)
	}
	if sub.Name() == "" {
		// A zero bus.Subscription (not returned by Subscribe): its series
		// would read 0 for ever, under subscription="".
		return nil, fmt.Errorf("%w: otelkeysched: Subscription with an empty name (a zero bus.Subscription?)", keysched.ErrInvalidOption)
	}
	cfg, err := newConfig(mp, opts)
	if err != nil {
		return nil, err
	}
	meter := mp.Meter(ScopeName)
	in, err := newInstruments(meter, true)
	if err != nil {
		return nil, fmt.Errorf("otelkeysched: %w", err)
	}
	base := append(append([]attribute.KeyValue(nil), cfg.attrs...), SubscriptionKey.String(sub.Name()))
	opt := metric.WithAttributeSet(attribute.NewSet(base...))
	release, err := claim(meter, familyScheduler, sub, base)
	if err != nil {
		return nil, err
	}
	reg, err := meter.RegisterCallback(subCallback(in, sub, base, opt), in.observables...)
	if err != nil {
		release()
		return nil, fmt.Errorf("otelkeysched: %w", err)
	}
	return &Registration{reg: reg, release: release}, nil
}

// subCallback reads a subscription's figures at collection time.
func subCallback(in *instruments, sub Subscription, base []attribute.KeyValue, opt metric.ObserveOption) metric.Callback {
	aged, _ := sub.(ObservedSubscription)
	return func(_ context.Context, o metric.Observer) error {
		st := sub.Stats()
		age := -1.0
		if aged != nil {
			age = aged.OldestAge().Seconds()
		}
		in.observeStats(o, st.Stats, base, age)
		o.ObserveInt64(in.dropped, int64(st.Dropped), opt)
		o.ObserveInt64(in.skipped, int64(st.Skipped), opt)
		o.ObserveInt64(in.ejectedEv, int64(st.EjectedEvents), opt)
		ej := int64(0)
		if st.Ejected {
			ej = 1
		}
		o.ObserveInt64(in.ejected, ej, opt)
		return nil
	}
}

// RegisterSubscription reports sub's figures at every collection, as the
// package-level RegisterSubscription does, for Metrics made with
// ForSubscription(sub.Name()); together with its Observer (given to
// bus.Subscribe with bus.Observe) that is the queue wait and duration
// histograms too, and the oldest age. Unregister stops it. Errors: a nil sub
// (a typed nil included) or a name other than ForSubscription's (wrapping
// keysched.ErrInvalidOption), ErrRegistered (m has a registration, or sub is
// registered with m's attributes on its MeterProvider), ErrUnregistered.
func (m *Metrics[K]) RegisterSubscription(sub Subscription) error {
	if m.zero() {
		return ErrZeroMetrics
	}
	if isNil(sub) {
		return fmt.Errorf("%w: otelkeysched: nil Subscription", keysched.ErrInvalidOption)
	}
	if m.subscription == "" || sub.Name() != m.subscription {
		return fmt.Errorf("%w: otelkeysched: RegisterSubscription(%q) on Metrics made ForSubscription(%q)",
			keysched.ErrInvalidOption, sub.Name(), m.subscription)
	}
	return m.register(sub, subCallback(m.in, sub, m.attrs, metric.WithAttributeSet(attribute.NewSet(m.attrs...))))
}

// RegisterBus reports a bus's own counters at every collection:
// keysched.bus.events.published, keysched.bus.events.unmatched and
// keysched.bus.subscriptions, with the attributes of WithAttributes. Its
// subscribers are registered one by one with RegisterSubscription.
// Errors: a nil b (a typed nil *bus.Bus included: it used to be accepted and
// panic at every collection) or a bad option (wrapping
// keysched.ErrInvalidOption); ErrRegistered when b is registered already on
// mp with the same attributes.
func RegisterBus(mp metric.MeterProvider, b Bus, opts ...Option) (*Registration, error) {
	if isNil(b) {
		return nil, fmt.Errorf("%w: otelkeysched: nil Bus", keysched.ErrInvalidOption)
	}
	cfg, err := newConfig(mp, opts)
	if err != nil {
		return nil, err
	}
	meter := mp.Meter(ScopeName)
	published, err1 := meter.Int64ObservableCounter(BusEventsPublished, metric.WithUnit("{event}"),
		metric.WithDescription("Events published (Publish calls past validation)."))
	unmatched, err2 := meter.Int64ObservableCounter(BusEventsUnmatched, metric.WithUnit("{event}"),
		metric.WithDescription("Published events that no subscriber matched."))
	subs, err3 := meter.Int64ObservableUpDownCounter(BusSubscriptions, metric.WithUnit("{subscription}"),
		metric.WithDescription("Subscriptions now (subscribed, not unsubscribed)."))
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			return nil, fmt.Errorf("otelkeysched: %w", err)
		}
	}
	opt := metric.WithAttributeSet(attribute.NewSet(cfg.attrs...))
	release, err := claim(meter, familyBus, b, cfg.attrs)
	if err != nil {
		return nil, err
	}
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := b.Stats()
		o.ObserveInt64(published, int64(st.Published), opt)
		o.ObserveInt64(unmatched, int64(st.Unmatched), opt)
		o.ObserveInt64(subs, int64(st.Subscribers), opt)
		return nil
	}, published, unmatched, subs)
	if err != nil {
		release()
		return nil, fmt.Errorf("otelkeysched: %w", err)
	}
	return &Registration{reg: reg, release: release}, nil
}
