package otelkeysched_test

// Regression tests from an adversarial review (branch break): each failed
// before its fix, but for TestRegisterRacingCollectAndClose (a -race check
// that passed).

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/bus"
	"github.com/keysched/keysched/otelkeysched"
)

// A typed nil *bus.Bus passed as a Bus was registered, and every
// collection then panicked in the exporter's goroutine (the process died
// far from the mistake); a typed nil *bus.Subscription panicked inside
// RegisterSubscription. Both are ErrInvalidOption now.
func TestTypedNilTargetsRefused(t *testing.T) {
	reader, mp := manualMeterProvider(t)
	var b *bus.Bus[string]
	_, err := otelkeysched.RegisterBus(mp, b)
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	var sub *bus.Subscription[string]
	require.NotPanics(t, func() {
		_, err = otelkeysched.RegisterSubscription(mp, sub)
	})
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	m, err := otelkeysched.New[string](mp, otelkeysched.ForSubscription("s"))
	require.NoError(t, err)
	require.NotPanics(t, func() { err = m.RegisterSubscription(sub) })
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	// Nothing registered: a collection reports nothing and does not panic.
	vals, _ := collect(t, reader)
	require.Empty(t, vals)
	// A nil or zero Registration's Unregister does not panic.
	var r *otelkeysched.Registration
	require.ErrorIs(t, r.Unregister(), otelkeysched.ErrZeroRegistration)
	require.ErrorIs(t, (&otelkeysched.Registration{}).Unregister(), otelkeysched.ErrZeroRegistration)
}

// One scheduler registered through two Metrics with the same attributes (a
// service and a library both "adding metrics") was accepted, and the SDK
// summed the two into one series: one task reported as two. Now the second
// is ErrRegistered, until the first is unregistered. Distinct attributes,
// or distinct schedulers, are still accepted.
func TestSameTargetRegisteredTwiceRefused(t *testing.T) {
	reader, mp := manualMeterProvider(t)
	ctx := context.Background()
	s, err := keysched.New[string](keysched.WithLogger(quiet))
	require.NoError(t, err)
	defer s.Close(ctx)
	c, err := s.Submit(ctx, "k", func(context.Context) error { return nil })
	require.NoError(t, err)
	<-c.Done()

	m1, err := otelkeysched.New[string](mp)
	require.NoError(t, err)
	require.NoError(t, m1.Register(s))
	m2, err := otelkeysched.New[string](mp)
	require.NoError(t, err)
	require.ErrorIs(t, m2.Register(s), otelkeysched.ErrRegistered)
	vals, _ := collect(t, reader)
	require.Equal(t, int64(1), vals["keysched.tasks.finished{outcome=succeeded}"], "one task, counted once")

	// Other attributes: another series, accepted.
	m3, err := otelkeysched.New[string](mp, otelkeysched.WithAttributes(attribute.String("view", "b")))
	require.NoError(t, err)
	require.NoError(t, m3.Register(s))
	require.NoError(t, m3.Unregister())
	// Another scheduler with the same attributes: accepted (their total).
	s2, err := keysched.New[string](keysched.WithLogger(quiet))
	require.NoError(t, err)
	defer s2.Close(ctx)
	m4, err := otelkeysched.New[string](mp)
	require.NoError(t, err)
	require.NoError(t, m4.Register(s2))
	require.NoError(t, m4.Unregister())
	// Once the first is unregistered, s can be registered again.
	require.NoError(t, m1.Unregister())
	m5, err := otelkeysched.New[string](mp)
	require.NoError(t, err)
	require.NoError(t, m5.Register(s))
	require.NoError(t, m5.Unregister())

	// The same for a bus and a subscription.
	b, err := bus.New[string](bus.WithLogger(quiet))
	require.NoError(t, err)
	defer b.Close(ctx)
	sub, err := bus.Subscribe(b, "mailer", func(context.Context, bus.Envelope[string], int) error { return nil })
	require.NoError(t, err)
	r1, err := otelkeysched.RegisterBus(mp, b)
	require.NoError(t, err)
	_, err = otelkeysched.RegisterBus(mp, b)
	require.ErrorIs(t, err, otelkeysched.ErrRegistered)
	s1, err := otelkeysched.RegisterSubscription(mp, sub)
	require.NoError(t, err)
	_, err = otelkeysched.RegisterSubscription(mp, sub)
	require.ErrorIs(t, err, otelkeysched.ErrRegistered)
	ms, err := otelkeysched.New[string](mp, otelkeysched.ForSubscription("mailer"))
	require.NoError(t, err)
	require.ErrorIs(t, ms.RegisterSubscription(sub), otelkeysched.ErrRegistered)
	require.NoError(t, s1.Unregister())
	require.NoError(t, ms.RegisterSubscription(sub), "free again")
	require.NoError(t, ms.Unregister())
	require.NoError(t, r1.Unregister())
	r2, err := otelkeysched.RegisterBus(mp, b)
	require.NoError(t, err)
	require.NoError(t, r2.Unregister())
}

// A MeterProvider of one's own whose Meter cannot be a map key: the guard
// is skipped, nothing panics.
type uncomparableMP struct {
	metric.MeterProvider
	tags []string
}

func (p uncomparableMP) Meter(name string, o ...metric.MeterOption) metric.Meter {
	return uncomparableMeter{p.MeterProvider.Meter(name, o...), p.tags}
}

type uncomparableMeter struct {
	metric.Meter
	tags []string
}

func TestUncomparableMeterNotTracked(t *testing.T) {
	sdk := sdkmetric.NewMeterProvider()
	defer sdk.Shutdown(context.Background())
	mp := uncomparableMP{sdk, []string{"x"}}
	s, err := keysched.New[string](keysched.WithLogger(quiet))
	require.NoError(t, err)
	defer s.Close(context.Background())
	for range 2 {
		m, err := otelkeysched.New[string](mp)
		require.NoError(t, err)
		require.NotPanics(t, func() { err = m.Register(s) })
		require.NoError(t, err)
		require.NoError(t, m.Unregister())
	}
}

// Register, Unregister and the scheduler's Close racing collections: no
// data race, no panic, no error from a collection; after Unregister the
// series are gone.
func TestRegisterRacingCollectAndClose(t *testing.T) {
	reader, mp := manualMeterProvider(t)
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			collect(t, reader)
		}
	})
	for i := range 20 {
		m, err := otelkeysched.New[int](mp)
		require.NoError(t, err)
		s, err := keysched.New[int](keysched.WithLogger(quiet), keysched.WithObserver(m.Observer()))
		require.NoError(t, err)
		var regWG sync.WaitGroup
		regWG.Go(func() { require.NoError(t, m.Register(s)) })
		for k := range 10 {
			_, _ = s.Submit(ctx, k, func(context.Context) error { return nil })
		}
		regWG.Go(func() { require.NoError(t, s.Close(ctx)) })
		regWG.Wait()
		if i%2 == 0 {
			require.ErrorIs(t, m.Register(s), otelkeysched.ErrRegistered)
		}
		require.NoError(t, m.Unregister())
		require.ErrorIs(t, m.Register(s), otelkeysched.ErrUnregistered)
	}
	close(stop)
	wg.Wait()
	vals, _ := collect(t, reader)
	require.Empty(t, only(vals, "keysched.tasks.pending"), "every scheduler unregistered")
}

// A Metrics reports one scheduler: registering a second one on it is
// ErrRegistered (its callback would replace the first's registration, which
// could then never be unregistered), and the first one's series stay as
// they were.
func TestOneMetricsRegistersOneScheduler(t *testing.T) {
	reader, mp := manualMeterProvider(t)
	ctx := context.Background()
	m, err := otelkeysched.New[string](mp)
	require.NoError(t, err)
	first, err := keysched.New[string](keysched.WithLogger(quiet))
	require.NoError(t, err)
	defer first.Close(ctx)
	second, err := keysched.New[string](keysched.WithLogger(quiet))
	require.NoError(t, err)
	defer second.Close(ctx)
	require.NoError(t, m.Register(first))
	require.ErrorIs(t, m.Register(second), otelkeysched.ErrRegistered)
	c, err := second.Submit(ctx, "k", func(context.Context) error { return nil })
	require.NoError(t, err)
	require.NoError(t, c.Wait(ctx))
	vals, _ := collect(t, reader)
	require.Equal(t, int64(0), vals["keysched.tasks.finished{outcome=succeeded}"], "the second scheduler is not reported")
	require.NoError(t, m.Unregister())
	vals, _ = collect(t, reader)
	require.Empty(t, vals, "Unregister removed every series")
}
