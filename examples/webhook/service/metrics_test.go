package service

import (
	"context"
	"sync"
	"testing"

	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// collectingMP is a MeterProvider whose reader collects right after every
// callback registration: what a PeriodicReader's goroutine or a scrape may
// do at any moment, forced at the worst one.
type collectingMP struct {
	metric.MeterProvider
	reader *sdkmetric.ManualReader

	mu        sync.Mutex
	collected []metricdata.ResourceMetrics
}

func (p *collectingMP) Meter(name string, o ...metric.MeterOption) metric.Meter {
	return collectingMeter{p.MeterProvider.Meter(name, o...), p}
}

type collectingMeter struct {
	metric.Meter
	p *collectingMP
}

func (m collectingMeter) RegisterCallback(f metric.Callback, in ...metric.Observable) (metric.Registration, error) {
	reg, err := m.Meter.RegisterCallback(f, in...)
	if err == nil {
		var rm metricdata.ResourceMetrics
		if cerr := m.p.reader.Collect(context.Background(), &rm); cerr == nil {
			m.p.mu.Lock()
			m.p.collected = append(m.p.collected, rm)
			m.p.mu.Unlock()
		}
	}
	return reg, err
}

// Found by attacking the code (adversarial review of the service: first written as a failing reproducer).
//
// A collection as soon as the service's gauges were registered: it ran
// Status on a Service whose relay New had not made yet (nil dereference:
// the process died). Now the gauges' callback is registered last.
func TestMetricsCollectedDuringNew(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	sdk := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer sdk.Shutdown(context.Background())
	mp := &collectingMP{MeterProvider: sdk, reader: reader}
	newHarness(t, map[string]sim.Behavior{"p": {}}, func(c *Config) { c.MeterProvider = mp })
	mp.mu.Lock()
	defer mp.mu.Unlock()
	found := false
	for _, rm := range mp.collected {
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name == MetricBacklog {
					g := m.Data.(metricdata.Gauge[int64])
					require.Len(t, g.DataPoints, 1, "one partner")
					found = true
				}
			}
		}
	}
	require.True(t, found, "a collection during New reported the backlog gauge")
}
