package service

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/examples/webhook/sim"
)

// The slope is the least-squares slope of the samples, per second.
func TestSlopeOfSamples(t *testing.T) {
	t0 := time.Unix(0, 0)
	v, span := slopeOf(nil)
	require.Zero(t, v)
	require.Zero(t, span)
	v, span = slopeOf([]trendSample{{t0, 5}, {t0.Add(10 * time.Second), 25}, {t0.Add(20 * time.Second), 45}})
	require.InDelta(t, 2.0, v, 1e-9)
	require.Equal(t, 20*time.Second, span)
	v, _ = slopeOf([]trendSample{{t0, 9}, {t0.Add(time.Second), 3}, {t0.Add(2 * time.Second), 9}})
	require.InDelta(t, 0, v, 1e-9, "up and down: flat")
}

// While a partner's endpoint is down and events keep coming, its backlog's
// slope is positive, on the operator page (with its chart) and in /metrics.
func TestBacklogSlopeShowsGrowth(t *testing.T) {
	mp, handler, err := NewPrometheus()
	require.NoError(t, err)
	defer mp.Shutdown(t.Context())
	h := newHarness(t, map[string]sim.Behavior{"down": {Down: true}, "fine": {}}, func(c *Config) {
		c.MeterProvider, c.MetricsHandler = mp, handler
		c.trendEvery = 10 * time.Millisecond
	})
	for i := range 10 {
		h.post("down", i)
		h.post("fine", i)
		time.Sleep(15 * time.Millisecond)
	}
	get := func(path string) string {
		resp, err := http.Get(h.admin.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	series := func(body, partner string) float64 {
		m := regexp.MustCompile(`(?m)^webhook_partner_backlog_slope_per_second\{[^}]*partner="` + partner + `"[^}]*\} (\S+)$`).FindStringSubmatch(body)
		require.NotNil(t, m, partner)
		v, err := strconv.ParseFloat(m[1], 64)
		require.NoError(t, err)
		return v
	}
	m := get("/metrics")
	require.Positive(t, series(m, "down"))
	series(m, "fine") // present (its value depends on the machine's pace)
	page := get("/")
	require.Regexp(t, `data-partner="down"[\s\S]*?<svg class="spark"[^>]*><polyline[\s\S]*?<td class="slope">(\+|&#43;)[0-9.]+/s</td>`, page, "a rising chart and a positive slope")
}

// The chart ends at the backlog the page shows now, and its title's max is
// the largest point charted: samples taken every 10 s may all predate a
// rise (the page showed backlog 6 next to "max 1"), and an all-zero chart
// says max 0 (not its scale's floor of 1).
func TestSparkTitleAgreesWithTheBacklogShown(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := newTrend([]string{"p", "idle"})
	tr.add(t0, map[string]int{"p": 0, "idle": 0})
	tr.add(t0.Add(10*time.Second), map[string]int{"p": 1, "idle": 0})
	tr.add(t0.Add(20*time.Second), map[string]int{"p": 0, "idle": 0})
	got := string(tr.spark("p", t0.Add(25*time.Second), 6))
	require.Contains(t, got, "<title>backlog, last 25s: max 6, now 6</title>")
	require.Equal(t, 4, len(regexp.MustCompile(`[0-9.]+,[0-9.]+`).FindAllString(got, -1)), "three samples and now: %s", got)
	require.Contains(t, string(tr.spark("idle", t0.Add(25*time.Second), 0)), "max 0, now 0")
	// A page rendered at the last sample's time: now replaces it.
	require.Contains(t, string(tr.spark("p", t0.Add(20*time.Second), 2)), "<title>backlog, last 20s: max 2, now 2</title>")
}
