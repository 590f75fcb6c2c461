package otelkeysched_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/bus"
	"github.com/keysched/keysched/otelkeysched"
)

type orderPlaced struct{ id int }

// A bus with three subscribers (one healthy, one dropping on a full key, one
// ejected after a timeout) reports each subscriber's counters under its name,
// and the bus's own; an unregistered subscriber's series are gone at the next
// collection.
func TestBusMetricsExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := manualMeterProvider(t)
		ctx := context.Background()
		b, err := bus.New[string](bus.WithWorkers(4), bus.WithLogger(quiet))
		require.NoError(t, err)
		defer b.Close(ctx)
		nameAttr := otelkeysched.WithAttributes(attribute.String("bus", "orders"))
		breg, err := otelkeysched.RegisterBus(mp, b, nameAttr)
		require.NoError(t, err)
		defer breg.Unregister()

		mailer, err := bus.Subscribe(b, "mailer", func(context.Context, bus.Envelope[string], orderPlaced) error { return nil })
		require.NoError(t, err)
		release := make(chan struct{})
		defer func() { // before b.Close, even when a check fails
			select {
			case <-release:
			default:
				close(release)
			}
		}()
		dropper, err := bus.Subscribe(b, "dropper", func(context.Context, bus.Envelope[string], orderPlaced) error {
			<-release
			return nil
		}, bus.MaxKeyDepth(1), bus.OnFull(bus.DropNewest))
		require.NoError(t, err)
		hung, err := bus.Subscribe(b, "hung", func(ctx context.Context, _ bus.Envelope[string], _ orderPlaced) error {
			<-ctx.Done()
			return ctx.Err()
		}, bus.Timeout(5*time.Second), bus.EjectAfter(1), bus.DeadLetters(func(bus.DeadLetter[string]) {}))
		require.NoError(t, err)
		var regs []*otelkeysched.Registration
		for _, sub := range []otelkeysched.Subscription{mailer, dropper, hung} {
			r, err := otelkeysched.RegisterSubscription(mp, sub, nameAttr)
			require.NoError(t, err)
			regs = append(regs, r)
		}

		for i := range 3 {
			_ = b.Publish(ctx, "k", orderPlaced{i}) // the dropper drops the 2nd and 3rd
		}
		synctest.Wait()
		time.Sleep(5 * time.Second) // the hung subscriber's first event times out: ejected
		synctest.Wait()
		_ = b.Publish(ctx, "k", orderPlaced{3}) // skipped by the ejected one, dropped by the dropper
		synctest.Wait()

		vals, units := collect(t, reader)
		B := "bus=orders"
		sub := func(name string) string { return B + ",subscription=" + name }
		fin := func(outcome, name string) string { return B + ",outcome=" + outcome + ",subscription=" + name }
		for _, n := range []string{"mailer", "dropper", "hung"} {
			t.Logf("%s: %v", n, only(vals, "subscription="+n+"}"))
		}
		require.Equal(t, int64(4), vals["keysched.bus.events.published{"+B+"}"])
		require.Equal(t, int64(0), vals["keysched.bus.events.unmatched{"+B+"}"])
		require.Equal(t, int64(3), vals["keysched.bus.subscriptions{"+B+"}"])
		require.Equal(t, "{event}", units["keysched.bus.events.dropped"])

		require.Equal(t, map[string]any{
			"keysched.tasks.pending{" + sub("mailer") + "}":               int64(0),
			"keysched.tasks.running{" + sub("mailer") + "}":               int64(0),
			"keysched.keys.live{" + sub("mailer") + "}":                   int64(0),
			"keysched.keys.parked{" + sub("mailer") + "}":                 int64(0),
			"keysched.tasks.finished{" + fin("succeeded", "mailer") + "}": int64(4),
			"keysched.tasks.finished{" + fin("failed", "mailer") + "}":    int64(0),
			"keysched.tasks.finished{" + fin("panicked", "mailer") + "}":  int64(0),
			"keysched.tasks.finished{" + fin("cancelled", "mailer") + "}": int64(0),
			"keysched.tasks.finished{" + fin("aborted", "mailer") + "}":   int64(0),
			"keysched.tasks.retried{" + sub("mailer") + "}":               int64(0),
			"keysched.tasks.snoozed{" + sub("mailer") + "}":               int64(0),
			"keysched.tasks.dead_lettered{" + sub("mailer") + "}":         int64(0),
			"keysched.tasks.rejected{" + sub("mailer") + "}":              int64(0),
			"keysched.bus.events.dropped{" + sub("mailer") + "}":          int64(0),
			"keysched.bus.events.skipped{" + sub("mailer") + "}":          int64(0),
			"keysched.bus.events.ejected{" + sub("mailer") + "}":          int64(0),
			"keysched.bus.subscriptions.ejected{" + sub("mailer") + "}":   int64(0),
			"keysched.tasks.oldest_age{" + sub("mailer") + "}":            0.0, // without bus.TaskAges: 0
		}, only(vals, "subscription=mailer}"))
		dropperVals := only(vals, "subscription=dropper}")
		require.Equal(t, int64(1), dropperVals["keysched.tasks.pending{"+sub("dropper")+"}"])
		require.Equal(t, int64(1), dropperVals["keysched.tasks.running{"+sub("dropper")+"}"])
		require.Equal(t, int64(1), dropperVals["keysched.keys.live{"+sub("dropper")+"}"])
		require.Equal(t, int64(3), dropperVals["keysched.bus.events.dropped{"+sub("dropper")+"}"])
		hungVals := only(vals, "subscription=hung}")
		require.Equal(t, int64(1), hungVals["keysched.bus.subscriptions.ejected{"+sub("hung")+"}"])
		require.Equal(t, int64(1), hungVals["keysched.bus.events.skipped{"+sub("hung")+"}"])
		require.Equal(t, int64(2), hungVals["keysched.bus.events.ejected{"+sub("hung")+"}"])
		require.Equal(t, int64(3), hungVals["keysched.tasks.finished{"+fin("failed", "hung")+"}"])
		require.Equal(t, int64(3), hungVals["keysched.tasks.dead_lettered{"+sub("hung")+"}"])
		require.Equal(t, int64(0), hungVals["keysched.tasks.pending{"+sub("hung")+"}"])

		// The dropper unregistered: its series are gone, the others stay.
		require.NoError(t, regs[1].Unregister())
		require.NoError(t, regs[1].Unregister())
		vals, _ = collect(t, reader)
		require.Empty(t, only(vals, "subscription=dropper}"))
		require.Len(t, only(vals, "subscription=mailer}"), 18)
		close(release)
		for _, r := range regs {
			require.NoError(t, r.Unregister())
		}
	})
}

// A subscription observed with Metrics made ForSubscription: the histograms
// and the oldest age carry its name too.
func TestObservedSubscriptionMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := manualMeterProvider(t)
		ctx := context.Background()
		b, err := bus.New[string](bus.WithWorkers(4), bus.WithLogger(quiet))
		require.NoError(t, err)
		release := make(chan struct{})
		defer func() {
			close(release)
			b.Close(ctx)
		}()
		m, err := otelkeysched.New[string](mp, otelkeysched.ForSubscription("ledger"))
		require.NoError(t, err)
		require.ErrorIs(t, m.Register(nil), keysched.ErrInvalidOption)
		sub, err := bus.Subscribe(b, "ledger", func(_ context.Context, _ bus.Envelope[string], o orderPlaced) error {
			if o.id == 0 {
				<-release
			}
			time.Sleep(time.Second)
			return nil
		}, bus.Observe(m.Observer()))
		require.NoError(t, err)
		other, err := bus.Subscribe(b, "other", func(context.Context, bus.Envelope[string], orderPlaced) error { return nil })
		require.NoError(t, err)
		require.ErrorIs(t, m.RegisterSubscription(other), keysched.ErrInvalidOption)
		require.NoError(t, m.RegisterSubscription(sub))
		require.ErrorIs(t, m.RegisterSubscription(sub), otelkeysched.ErrRegistered)
		defer m.Unregister()

		require.NoError(t, b.Publish(ctx, "k", orderPlaced{0})) // held until release
		require.NoError(t, b.Publish(ctx, "k2", orderPlaced{1}))
		time.Sleep(30 * time.Second)
		synctest.Wait()
		vals, _ := collect(t, reader)
		L := "subscription=ledger"
		require.Equal(t, 30.0, vals["keysched.tasks.oldest_age{"+L+"}"])
		require.Equal(t, int64(1), vals["keysched.tasks.pending{"+L+"}"])
		require.Equal(t, hist{Count: 2, Sum: 0, Buckets: map[float64]uint64{0.0001: 2}}, vals["keysched.task.queue_wait{"+L+"}"])
		require.Equal(t, hist{Count: 1, Sum: 1, Buckets: map[float64]uint64{1: 1}}, vals["keysched.task.duration{outcome=succeeded,"+L+"}"])
		require.Empty(t, only(vals, "subscription=other"), "other is not registered")
	})
}
