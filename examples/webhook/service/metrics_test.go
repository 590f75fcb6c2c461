package service

import (
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/sim"
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

func TestMetricsServed(t *testing.T) {
	mp, handler, err := NewPrometheus()
	require.NoError(t, err)
	defer mp.Shutdown(context.Background())
	// h's endpoint hangs: its delivery is in flight when /metrics is read,
	// so the relay's scheduler has a task with an age.
	h := newHarness(t, map[string]sim.Behavior{"p": {Down: true}, "q": {}, "h": {Hang: true}}, func(c *Config) {
		c.MeterProvider = mp
		c.MetricsHandler = handler
		c.Retry = keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	})
	for i := range 3 {
		h.post("p", i)
		h.post("q", i)
	}
	h.post("h", 0)
	require.Eventually(t, func() bool { return len(h.parked()) == 1 && h.delivered("q") }, waitLong, 5*time.Millisecond)
	scrape := func() string {
		resp, err := http.Get(h.admin.URL + "/metrics")
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return string(b)
	}
	// The relay's scheduler through otelkeysched's Observer (given with
	// outbox.WithSchedulerOptions): queue wait and attempt duration
	// histograms with samples, and the age of the hanging delivery.
	value := func(body, series string) float64 {
		m := regexp.MustCompile(`(?m)^` + series + `\{[^}]*scheduler="webhook.delivery"[^}]*\} (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			return -1
		}
		v, err := strconv.ParseFloat(m[1], 64)
		require.NoError(t, err)
		return v
	}
	qDelivered := regexp.MustCompile(`webhook_deliveries_total\{[^}]*partner="q",result="delivered"[^}]*\} [3-9]\n`)
	var body string
	require.Eventually(t, func() bool {
		if _, received := h.rec.Total(); received < 6 { // q: 3, p: 2, h: 1 (hanging)
			return false
		}
		body = scrape()
		// The endpoint has q's third event before the service counts it:
		// a delivery is counted once its row's mark, with its attempt, has
		// committed (markhook.go), a moment after the call returned (CI
		// scraped 2 once).
		return value(body, `keysched_tasks_oldest_age_seconds`) > 0 && qDelivered.MatchString(body)
	}, waitLong, 5*time.Millisecond, "the hanging delivery's age, and q's three deliveries counted")
	require.GreaterOrEqual(t, value(body, `keysched_task_queue_wait_seconds_count`), 5.0, "a queue wait per delivery started (q: 3, p: 1 then parked, h: 1)")
	require.GreaterOrEqual(t, value(body, `keysched_task_duration_seconds_count`), 1.0, "attempt durations")
	require.Regexp(t, `keysched_task_duration_seconds_count\{[^}]*outcome="succeeded"[^}]*\} [3-9]`, body)
	require.Regexp(t, `keysched_task_duration_seconds_count\{[^}]*outcome="failed"[^}]*\} [2-9]`, body)
	require.Contains(t, body, `keysched_task_queue_wait_seconds_bucket{`)
	require.Contains(t, body, `keysched_task_duration_seconds_bucket{`)
	h.eps["h"].Set(sim.Behavior{})
	for _, want := range []string{
		`webhook_partner_backlog{otel_scope_name="github.com/keysched/keysched/examples/webhook"`,
		`webhook_partner_parked{`,
		`webhook_deliveries_total{`,
		`webhook_partner_parks_total{`,
		`webhook_intake_events_total{`,
		`webhook_delivery_latency_seconds_bucket{`,
		// The relay's scheduler, through otelkeysched.
		`keysched_tasks_pending{`,
		`keysched_keys_live{`,
		`keysched_tasks_retried_total{`,
	} {
		require.Contains(t, body, want)
	}
	require.Regexp(t, `webhook_partner_backlog\{[^}]*partner="p"[^}]*\} 3\n`, body)
	require.Regexp(t, `webhook_partner_parked\{[^}]*partner="p"[^}]*\} 1\n`, body)
	// The README says: alert on webhook_partner_parked, not on the
	// scheduler's keysched_keys_parked, 0 here while p is parked (the
	// outbox parks a partner by its dead row, not its scheduler key).
	require.Regexp(t, `keysched_keys_parked\{[^}]*\} 0\n`, body)
	require.Regexp(t, `webhook_partner_parks_total\{[^}]*partner="p"[^}]*\} 1\n`, body)
	require.Regexp(t, qDelivered, body) // 3, or more with a redelivery

	// Every metric name the README gives is one served: the Prometheus
	// names as series of this scrape (it named
	// webhook_partner_backlog_slope, served as ..._per_second), the
	// OpenTelemetry ones as the prefix of one. A replay first, so that
	// its counter has a series.
	_, err = h.svc.Replay(t.Context(), h.acceptedIDs("q")[0])
	require.NoError(t, err)
	body = scrape()
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	notMetrics := map[string]bool{"webhook_attempt": true, "webhook_replay": true, "webhook_intake": true, "webhook_outbox": true, "keysched_test": true}
	names := regexp.MustCompile(`\b(?:webhook|keysched)_[a-z_]+\b`).FindAllString(string(readme), -1)
	require.NotEmpty(t, names)
	for _, name := range names {
		if !notMetrics[name] {
			require.Regexp(t, `(?m)^`+name+`[{ ]`, body, "the README's %s", name)
		}
	}
	for _, m := range regexp.MustCompile("`((?:webhook|keysched)\\.[a-z_.]+)[`{]").FindAllStringSubmatch(string(readme), -1) {
		require.Regexp(t, `(?m)^`+strings.ReplaceAll(m[1], ".", "_"), body, "the README's %s", m[1])
	}
}
