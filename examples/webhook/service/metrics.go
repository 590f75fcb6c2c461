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
	// The backlog's flow, for an alert on its slope: the backlog grows by
	// enqueued and shrinks by settled (rate(enqueued) - rate(settled) is
	// its slope, robust to scrape gaps); and the slope the service itself
	// computes over the last 5 minutes of samples (backlog_slope).
	MetricEnqueued = "webhook.partner.enqueued"      // {event}, counter: accepted events and replays queued
	MetricSettled  = "webhook.partner.settled"       // {event}, counter: deliveries that got a 2xx, and skips
	MetricSlope    = "webhook.partner.backlog_slope" // {event}/s, gauge: least-squares slope of the backlog over the last 5 minutes
	MetricReplays  = "webhook.replays"               // {event}, counter, attribute result: requeued|recovered
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
	enqueuedC  metric.Int64Counter
	settledC   metric.Int64Counter
	replays    metric.Int64Counter
	slope      metric.Float64ObservableGauge
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
	if mt.enqueuedC, err = m.Int64Counter(MetricEnqueued, metric.WithUnit("{event}"),
		metric.WithDescription("Events entering a partner's backlog: accepted, and replays queued.")); err != nil {
		return nil, err
	}
	if mt.settledC, err = m.Int64Counter(MetricSettled, metric.WithUnit("{event}"),
		metric.WithDescription("Events leaving a partner's backlog: deliveries that got a 2xx, and skips.")); err != nil {
		return nil, err
	}
	if mt.replays, err = m.Int64Counter(MetricReplays, metric.WithUnit("{event}"),
		metric.WithDescription("Events an operator replayed, by partner and result (requeued: sent again; recovered: a parked event retried).")); err != nil {
		return nil, err
	}
	if mt.slope, err = m.Float64ObservableGauge(MetricSlope, metric.WithUnit("{event}/s"),
		metric.WithDescription("Slope of the partner's backlog over the last 5 minutes (least squares over 10 s samples); > 0: growing.")); err != nil {
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
	backlog, oldest, parked, slope := m.backlog, m.oldest, m.parkedG, m.slope
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
			v, _ := s.trend.slope(st.Partner)
			o.ObserveFloat64(slope, v, a)
		}
		return nil
	}, backlog, oldest, parked, slope)
	return err
}

func partnerAttr(p string) attribute.KeyValue { return attribute.String("partner", p) }

func (m *metrics) delivered(ctx context.Context, partner string, latency time.Duration) {
	m.deliveries.Add(ctx, 1, metric.WithAttributes(partnerAttr(partner), attrDelivered))
	m.latency.Record(ctx, latency.Seconds(), metric.WithAttributes(partnerAttr(partner)))
}

// deliveredReplay counts a replay's successful delivery (not in the
// latency histogram: its intake was long ago).
func (m *metrics) deliveredReplay(ctx context.Context, partner string) {
	m.deliveries.Add(ctx, 1, metric.WithAttributes(partnerAttr(partner), attrDelivered))
}

func (m *metrics) enqueued(ctx context.Context, partner string, n int64) {
	m.enqueuedC.Add(ctx, n, metric.WithAttributes(partnerAttr(partner)))
}

func (m *metrics) settled(ctx context.Context, partner string) {
	m.settledC.Add(ctx, 1, metric.WithAttributes(partnerAttr(partner)))
}

func (m *metrics) replayed(ctx context.Context, partner, result string) {
	m.replays.Add(ctx, 1, metric.WithAttributes(partnerAttr(partner), attribute.String("result", result)))
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
