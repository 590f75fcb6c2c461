package kafka

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/optcheck"
	"github.com/keysched/keysched/otelkeysched"
)

// This file holds the consumer's OpenTelemetry metrics (WithMeterProvider);
// the package documentation (doc.go, "Metrics") lists them.

// meterScope is the instrumentation scope of the consumer's instruments.
const meterScope = "github.com/keysched/keysched/kafka"

// WithMeterProvider reports the consumer's metrics to mp (see the list
// above), with attrs added to every measurement (a service or cluster name;
// never a record key). The metrics are listed in the package documentation
// (Metrics). A keysched.WithObserver given with WithSchedulerOptions is
// refused (see there). Close stops the reporting. A nil mp is an error.
// Given twice, the last wins with its own attrs.
func WithMeterProvider(mp metric.MeterProvider, attrs ...attribute.KeyValue) Option {
	return func(c *config) error {
		if mp == nil {
			return refused(optcheck.NotNil("WithMeterProvider", true, "a meter provider"))
		}
		for _, a := range attrs {
			if !a.Valid() {
				return refused(optcheck.Refuse("WithMeterProvider", nil, "invalid attribute %q", a.Key))
			}
		}
		c.meterProvider = mp
		c.meterAttrs = slices.Clone(attrs)
		return nil
	}
}

type consumerMetrics struct {
	c        *Consumer
	meter    metric.Meter
	attrs    []attribute.KeyValue // WithMeterProvider's
	consumed messagingconv.ClientConsumedMessages
	process  messagingconv.ProcessDuration
	lag      metric.Int64ObservableGauge
	commit   metric.Int64ObservableGauge
	frontier metric.Int64ObservableGauge
	inflight metric.Int64ObservableUpDownCounter
	held     metric.Int64ObservableUpDownCounter
	paused   metric.Int64ObservableGauge

	sched atomic.Pointer[keysched.Observer[schedKey]] // otelkeysched's, once the group is known
	sm    *otelkeysched.Metrics[schedKey]
	reg   metric.Registration

	sets sync.Map // tp -> *tpSets
}

// tpSets are one partition's attribute sets, made once.
type tpSets struct {
	poll, ok, failed attribute.Set // consumed; process succeeded; process failed
	gauge            metric.MeasurementOption
}

// newMetrics makes the instruments and returns the scheduler option that
// times every handler run.
func (c *Consumer) newMetrics() (keysched.Option, error) {
	m := &consumerMetrics{c: c, attrs: c.cfg.meterAttrs}
	m.meter = c.cfg.meterProvider.Meter(meterScope, metric.WithSchemaURL(semconv.SchemaURL))
	var errs [8]error
	m.consumed, errs[0] = messagingconv.NewClientConsumedMessages(m.meter)
	m.process, errs[1] = messagingconv.NewProcessDuration(m.meter, metric.WithExplicitBucketBoundaries(otelkeysched.DefaultBuckets...))
	m.lag, errs[2] = m.meter.Int64ObservableGauge("keysched.kafka.partition.lag", metric.WithUnit("{message}"),
		metric.WithDescription("Records of the partition not yet committed: its high watermark minus the committed offset."))
	m.commit, errs[3] = m.meter.Int64ObservableGauge("keysched.kafka.partition.committed_offset", metric.WithUnit("{offset}"),
		metric.WithDescription("The partition's last committed offset."))
	m.frontier, errs[4] = m.meter.Int64ObservableGauge("keysched.kafka.partition.frontier", metric.WithUnit("{offset}"),
		metric.WithDescription("The offset a commit now would write: the lowest record fetched and not finished."))
	m.inflight, errs[5] = m.meter.Int64ObservableUpDownCounter("keysched.kafka.partition.in_flight", metric.WithUnit("{message}"),
		metric.WithDescription("Records of the partition fetched and not finished."))
	m.held, errs[6] = m.meter.Int64ObservableUpDownCounter("keysched.kafka.partition.held", metric.WithUnit("{message}"),
		metric.WithDescription("Records of the partition held back by the poll loop (their key or the scheduler full)."))
	m.paused, errs[7] = m.meter.Int64ObservableGauge("keysched.kafka.partition.paused", metric.WithUnit("{partition}"),
		metric.WithDescription("1 while fetching from the partition is paused (backpressure), else 0."))
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("%w: WithMeterProvider: %w", ErrInvalidOption, err)
		}
	}
	c.metrics = m
	return keysched.WithObserver(keysched.Observer[schedKey]{
		AttemptStarted: func(k schedKey, a keysched.AttemptInfo) {
			if o := m.sched.Load(); o != nil {
				o.AttemptStarted(k, a)
			}
		},
		AttemptEnded: func(k schedKey, a keysched.AttemptInfo) {
			// A scheduler task is a group of records (group.go): the
			// process duration is recorded per handler run, by processed.
			if o := m.sched.Load(); o != nil {
				o.AttemptEnded(k, a)
			}
		},
	}), nil
}

// register starts the asynchronous instruments, once the group is known.
func (m *consumerMetrics) register() error {
	group := semconv.MessagingConsumerGroupName(m.c.group)
	sm, err := otelkeysched.New[schedKey](m.c.cfg.meterProvider,
		otelkeysched.WithAttributes(append([]attribute.KeyValue{group}, m.attrs...)...))
	if err != nil {
		return fmt.Errorf("%w: WithMeterProvider: %w", ErrInvalidOption, err)
	}
	if err := sm.Register(m.c.sched); err != nil {
		return fmt.Errorf("%w: WithMeterProvider: %w", ErrInvalidOption, err)
	}
	o := sm.Observer()
	m.sched.Store(&o)
	m.sm = sm
	m.reg, err = m.meter.RegisterCallback(m.observe, m.lag, m.commit, m.frontier, m.inflight, m.held, m.paused)
	if err != nil {
		_ = sm.Unregister()
		return fmt.Errorf("%w: WithMeterProvider: %w", ErrInvalidOption, err)
	}
	return nil
}

// observe reports the owned partitions: a revoked or lost one is absent
// from Stats, so its series end here.
func (m *consumerMetrics) observe(_ context.Context, o metric.Observer) error {
	for _, p := range m.c.Stats().Partitions {
		opt := m.setsOf(p.Topic, p.Partition).gauge
		if p.HighWatermark >= 0 {
			o.ObserveInt64(m.lag, p.Lag, opt)
		}
		if p.Committed >= 0 {
			o.ObserveInt64(m.commit, p.Committed, opt)
		}
		o.ObserveInt64(m.frontier, p.Frontier, opt)
		o.ObserveInt64(m.inflight, int64(p.InFlight), opt)
		o.ObserveInt64(m.held, int64(p.Held), opt)
		paused := int64(0)
		if p.Paused {
			paused = 1
		}
		o.ObserveInt64(m.paused, paused, opt)
	}
	return nil
}

func (m *consumerMetrics) setsOf(topic string, part int32) *tpSets {
	k := tp{topic, part}
	if s, ok := m.sets.Load(k); ok {
		return s.(*tpSets)
	}
	base := append([]attribute.KeyValue{
		semconv.MessagingSystemKafka,
		semconv.MessagingDestinationName(topic),
		semconv.MessagingDestinationPartitionID(strconv.Itoa(int(part))),
		semconv.MessagingConsumerGroupName(m.c.group),
	}, m.attrs...)
	with := func(kv ...attribute.KeyValue) attribute.Set {
		return attribute.NewSet(append(append([]attribute.KeyValue(nil), base...), kv...)...)
	}
	s := &tpSets{
		poll:   with(semconv.MessagingOperationName("poll")),
		ok:     with(semconv.MessagingOperationName("process")),
		failed: with(semconv.MessagingOperationName("process"), semconv.ErrorTypeOther),
		gauge:  metric.WithAttributeSet(attribute.NewSet(base...)),
	}
	v, _ := m.sets.LoadOrStore(k, s)
	return v.(*tpSets)
}

// processed records one handler run of a record of (topic, part).
func (m *consumerMetrics) processed(topic string, part int32, d time.Duration, failed bool) {
	s := m.setsOf(topic, part)
	set := s.ok
	if failed {
		set = s.failed
	}
	m.process.RecordSet(context.Background(), d.Seconds(), set)
}

// consumedN counts n records of one partition handed to the scheduler.
func (m *consumerMetrics) consumedN(topic string, part int32, n int) {
	if n > 0 {
		m.consumed.AddSet(context.Background(), int64(n), m.setsOf(topic, part).poll)
	}
}

// stop ends the reporting (Close).
func (m *consumerMetrics) stop() {
	if m.reg != nil {
		_ = m.reg.Unregister()
	}
	if m.sm != nil {
		_ = m.sm.Unregister()
	}
}
