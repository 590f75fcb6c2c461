package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreCurrent()) }

// The example serves /metrics on loopback: a scrape over HTTP has every
// metric family of the scheduler, with the known batch's exact values, and
// /debug/keys lists the parked account first.
func TestScrapeOverHTTP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- run(ctx, ln, false, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()

	scrape := func() map[string]*dto.MetricFamily {
		t.Helper()
		resp, err := http.Get(base + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		require.NoError(t, err)
		return fams
	}
	// A Completion is done once its outcome is counted; the pending gauge
	// drops when its runner lets the key go, a moment later: a scrape right
	// after the batch settled read 3 pending once (CI, a loaded machine).
	// Scrape until the gauge settles (bounded), then check everything on
	// that one scrape.
	var fams map[string]*dto.MetricFamily
	for deadline := time.Now().Add(10 * time.Second); ; {
		fams = scrape()
		if pending(fams) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var names []string
	for n := range fams {
		if strings.HasPrefix(n, "keysched_") {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	require.Equal(t, []string{
		"keysched_keys_live",
		"keysched_keys_parked",
		"keysched_task_duration_seconds",
		"keysched_task_queue_wait_seconds",
		"keysched_tasks_dead_lettered_total",
		"keysched_tasks_finished_total",
		"keysched_tasks_oldest_age_seconds",
		"keysched_tasks_pending",
		"keysched_tasks_rejected_total",
		"keysched_tasks_retried_total",
		"keysched_tasks_running", "keysched_tasks_snoozed_total",
	}, names)

	// value returns the sample of family name whose labels include want.
	value := func(name string, want map[string]string) float64 {
		t.Helper()
		f := fams[name]
		require.NotNil(t, f, name)
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			ok := true
			for k, v := range want {
				ok = ok && labels[k] == v
			}
			if !ok {
				continue
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
		t.Fatalf("%s%v: no sample", name, want)
		return 0
	}
	orders := map[string]string{"scheduler": "orders"}
	require.Equal(t, 100.0, value("keysched_tasks_finished_total", map[string]string{"scheduler": "orders", "outcome": "succeeded"}))
	require.Equal(t, 0.0, value("keysched_tasks_finished_total", map[string]string{"scheduler": "orders", "outcome": "failed"}))
	require.Equal(t, 1.0, value("keysched_keys_parked", orders))
	require.Equal(t, 2.0, value("keysched_tasks_pending", orders), "the parked event and the one behind it")
	require.Equal(t, 1.0, value("keysched_tasks_dead_lettered_total", orders))
	require.Equal(t, 101.0, value("keysched_task_queue_wait_seconds", orders), "observations: every task that started")
	require.Positive(t, value("keysched_tasks_oldest_age_seconds", orders))

	resp, err := http.Get(base + "/debug/keys")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	var keys []struct {
		Key    string
		Depth  int
		Parked bool
	}
	require.NoError(t, json.Unmarshal(body, &keys), string(body))
	require.Len(t, keys, 1, string(body))
	require.Equal(t, "acct-bad", keys[0].Key)
	require.Equal(t, 2, keys[0].Depth)
	require.True(t, keys[0].Parked)

	cancel()
	require.NoError(t, <-done)
}

// pending is the orders scheduler's keysched_tasks_pending gauge in fams, or
// -1 when it has no sample.
func pending(fams map[string]*dto.MetricFamily) float64 {
	for _, m := range fams["keysched_tasks_pending"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "scheduler" && l.GetValue() == "orders" {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}
