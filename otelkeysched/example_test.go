package otelkeysched_test

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/bus"
	"github.com/keysched/keysched/otelkeysched"
)

// Observe a scheduler: the histograms through its Observer, the counters and
// the oldest task's age read at each collection. (A real program gives an
// exporter to the MeterProvider: Prometheus, OTLP; see the example module.)
func ExampleNew() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)

	m, err := otelkeysched.New[string](mp, otelkeysched.WithAttributes(attribute.String("scheduler", "ledger")))
	if err != nil {
		panic(err)
	}
	s, err := keysched.New[string](keysched.WithObserver(m.Observer()))
	if err != nil {
		panic(err)
	}
	if err := m.Register(s); err != nil {
		panic(err)
	}
	defer m.Unregister()

	for _, acct := range []string{"alice", "bob", "alice"} {
		s.Submit(ctx, acct, func(context.Context) error { return nil })
	}
	s.Close(ctx)

	var rm metricdata.ResourceMetrics
	reader.Collect(ctx, &rm)
	for _, met := range rm.ScopeMetrics[0].Metrics {
		switch d := met.Data.(type) {
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				if o, ok := p.Attributes.Value(otelkeysched.OutcomeKey); met.Name == otelkeysched.TasksFinished && ok && o.AsString() == "succeeded" {
					fmt.Println(met.Name, "succeeded:", p.Value)
				}
			}
		case metricdata.Histogram[float64]:
			if met.Name == otelkeysched.TaskQueueWait {
				fmt.Println(met.Name, "count:", d.DataPoints[0].Count, "unit:", met.Unit)
			}
		}
	}
	// Output:
	// keysched.tasks.finished succeeded: 3
	// keysched.task.queue_wait count: 3 unit: s
}

// Each bus subscriber reports its counters with the attribute
// subscription=<name>, the bus its own.
func ExampleRegisterSubscription() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)

	b, _ := bus.New[string]()
	breg, _ := otelkeysched.RegisterBus(mp, b)
	defer breg.Unregister()
	sub, _ := bus.Subscribe(b, "mailer", func(context.Context, bus.Envelope[string], string) error { return nil })
	reg, err := otelkeysched.RegisterSubscription(mp, sub)
	if err != nil {
		panic(err)
	}
	defer reg.Unregister()

	b.Publish(ctx, "alice", "welcome")
	b.Publish(ctx, "alice", "receipt")
	b.Close(ctx)

	var rm metricdata.ResourceMetrics
	reader.Collect(ctx, &rm)
	for _, met := range rm.ScopeMetrics[0].Metrics {
		if d, ok := met.Data.(metricdata.Sum[int64]); ok && (met.Name == otelkeysched.TasksFinished || met.Name == otelkeysched.BusEventsPublished) {
			for _, p := range d.DataPoints {
				if o, ok := p.Attributes.Value(otelkeysched.OutcomeKey); ok && o.AsString() != "succeeded" {
					continue
				}
				name, _ := p.Attributes.Value(otelkeysched.SubscriptionKey)
				fmt.Printf("%s %q %d\n", met.Name, name.AsString(), p.Value)
			}
		}
	}
	// Unordered output:
	// keysched.bus.events.published "" 2
	// keysched.tasks.finished "mailer" 2
}
