package service

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Metric names of the service (the scheduler's own come from otelkeysched).
// The partner attribute is safe here, unlike a scheduler key in general:
// partners are a configured, bounded set, not one per account or user.
const (
	MetricBacklog    = "webhook.partner.backlog"    // {event}, gauge: accepted, undelivered
	MetricOldestAge  = "webhook.partner.oldest_age" // s, gauge: age of the oldest undelivered event
	MetricParked     = "webhook.partner.parked"     // {partner}, gauge: 1 when parked
	MetricDeliveries = "webhook.deliveries"         // {attempt}, counter, attribute result: delivered|failed|refused (a local refusal: no call, not counted as an attempt)
	MetricParks      = "webhook.partner.parks"      // {park}, counter
	MetricIntake     = "webhook.intake.events"      // {event}, counter, attribute result: accepted|rejected
	MetricLatency    = "webhook.delivery.latency"   // s, histogram: intake to successful delivery
)

type metrics struct {
	meter      metric.Meter
	backlog    metric.Int64ObservableGauge
	oldest     metric.Float64ObservableGauge
	parkedG    metric.Int64ObservableGauge
	deliveries metric.Int64Counter
	parks      metric.Int64Counter
	intake     metric.Int64Counter
	latency    metric.Float64Histogram
	reg        metric.Registration
}

var (
	attrDelivered = attribute.String("result", "delivered")
	attrFailed    = attribute.String("result", "failed")
	attrRefused   = attribute.String("result", "refused")
	attrAccepted  = attribute.String("result", "accepted")
	attrRejected  = attribute.String("result", "rejected")
)

// newMetrics makes the instruments. The gauges' callback, which reads the
// whole service (Status), is registered by observe once the service is
// complete: a reader may collect at any moment after registration (a
// PeriodicReader's goroutine, a scrape), and a collection during New found
// the relay not made yet (a nil dereference that killed the process).
func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/keysched/keysched/examples/webhook")
	var (
		mt  = metrics{meter: m}
		err error
	)
	if mt.deliveries, err = m.Int64Counter(MetricDeliveries, metric.WithUnit("{attempt}"),
		metric.WithDescription("Delivery attempts by partner and result.")); err != nil {
		return nil, err
	}
	if mt.parks, err = m.Int64Counter(MetricParks, metric.WithUnit("{park}"),
		metric.WithDescription("Times a partner was parked after its head event ran out of attempts.")); err != nil {
		return nil, err
	}
	if mt.intake, err = m.Int64Counter(MetricIntake, metric.WithUnit("{event}"),
		metric.WithDescription("Intake requests by partner and result (rejected: backlog over its bound, 429).")); err != nil {
		return nil, err
	}
	if mt.latency, err = m.Float64Histogram(MetricLatency, metric.WithUnit("s"),
		metric.WithDescription("Time from intake to the successful delivery of an event."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)); err != nil {
		return nil, err
	}
	if mt.backlog, err = m.Int64ObservableGauge(MetricBacklog, metric.WithUnit("{event}"),
		metric.WithDescription("Accepted events not yet delivered, per partner.")); err != nil {
		return nil, err
	}
	if mt.oldest, err = m.Float64ObservableGauge(MetricOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest undelivered event, per partner (0 when none).")); err != nil {
		return nil, err
	}
	if mt.parkedG, err = m.Int64ObservableGauge(MetricParked, metric.WithUnit("{partner}"),
		metric.WithDescription("1 when the partner is parked, else 0.")); err != nil {
		return nil, err
	}
	return &mt, nil
}

// observe registers the gauges' callback, read at collection time (nothing
// is recorded per event for these). Call it once s is complete.
func (m *metrics) observe(s *Service) error {
	backlog, oldest, parked := m.backlog, m.oldest, m.parkedG
	var err error
	m.reg, err = m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		all, err := s.Status(ctx)
		if err != nil {
			return err
		}
		for _, st := range all {
			a := metric.WithAttributes(attribute.String("partner", st.Partner))
			o.ObserveInt64(backlog, int64(st.Backlog), a)
			o.ObserveFloat64(oldest, st.OldestAge.Seconds(), a)
			p := int64(0)
			if st.Parked {
				p = 1
			}
			o.ObserveInt64(parked, p, a)
		}
		return nil
	}, backlog, oldest, parked)
	return err
}

func partnerAttr(p string) attribute.KeyValue { return attribute.String("partner", p) }

func (m *metrics) delivered(ctx context.Context, partner string, latency time.Duration) {
	m.deliveries.Add(ctx, 1, metric.WithAttributes(partnerAttr(partner), attrDelivered))
	m.latency.Record(ctx, latency.Seconds(), metric.WithAttributes(partnerAttr(partner)))
}

func (m *metrics) failed(ctx context.Context, partner string) {
	m.deliveries.Add(ctx, 1, metric.WithAttributes(partnerAttr(partner), attrFailed))
}

func (m *metrics) refused(ctx context.Context, partner string) {
	m.deliveries.Add(ctx, 1, metric.WithAttributes(partnerAttr(partner), attrRefused))
}

func (m *metrics) parked(ctx context.Context, partner string) {
	m.parks.Add(ctx, 1, metric.WithAttributes(partnerAttr(partner)))
}

func (m *metrics) accepted(ctx context.Context, partner string) {
	m.intake.Add(ctx, 1, metric.WithAttributes(partnerAttr(partner), attrAccepted))
}

func (m *metrics) rejected(ctx context.Context, partner string) {
	m.intake.Add(ctx, 1, metric.WithAttributes(partnerAttr(partner), attrRejected))
}

func (m *metrics) close() error {
	if m.reg != nil {
		return m.reg.Unregister()
	}
	return nil
}
