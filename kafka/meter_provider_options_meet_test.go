package kafka

import (
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
)

// WithMeterProvider given twice: the last wins, provider and attributes
// together, by keysched.Option's rule (the attributes of the first were
// kept and added to the second provider's measurements).
func TestLastWithMeterProviderWinsWithItsAttributes(t *testing.T) {
	first, last := noop.NewMeterProvider(), noop.NewMeterProvider()
	cfg := defaultConfig()
	for _, o := range []Option{
		WithMeterProvider(first, attribute.String("cluster", "old")),
		WithMeterProvider(last, attribute.String("service", "billing")),
	} {
		if err := o(&cfg); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.meterProvider != last {
		t.Errorf("provider %v, want the last", cfg.meterProvider)
	}
	if want := []attribute.KeyValue{attribute.String("service", "billing")}; len(cfg.meterAttrs) != 1 || cfg.meterAttrs[0] != want[0] {
		t.Errorf("attributes %v, want %v", cfg.meterAttrs, want)
	}
}
