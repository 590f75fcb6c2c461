package service

import (
	"fmt"
	"html/template"
	"strings"
	"sync"
	"time"
)

// The backlog's trend: every trendEvery the sampler records each partner's
// backlog; the last trendSamples samples (5 minutes) make the operator
// page's small chart and the slope (Slope, the gauge
// webhook.partner.backlog_slope): "alert on the slope of the backlog rather
// than its level".
const (
	trendEvery   = 10 * time.Second
	trendSamples = 31 // 30 intervals
)

type trendSample struct {
	at      time.Time
	backlog int
}

type trend struct {
	mu  sync.Mutex
	per map[string][]trendSample // partner -> oldest first, at most trendSamples
}

func newTrend(partners []string) *trend {
	t := &trend{per: map[string][]trendSample{}}
	for _, p := range partners {
		t.per[p] = nil
	}
	return t
}

func (t *trend) add(now time.Time, backlog map[string]int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for p, n := range backlog {
		s := append(t.per[p], trendSample{now, n})
		if len(s) > trendSamples {
			s = append(s[:0], s[len(s)-trendSamples:]...)
		}
		t.per[p] = s
	}
}

// slope returns the partner's backlog change per second over the samples
// (least squares; 0 with fewer than two), and the samples' span.
func (t *trend) slope(partner string) (perSec float64, span time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slopeOf(t.per[partner])
}

func slopeOf(s []trendSample) (float64, time.Duration) {
	if len(s) < 2 {
		return 0, 0
	}
	t0 := s[0].at
	var sx, sy, sxx, sxy float64
	for _, v := range s {
		x := v.at.Sub(t0).Seconds()
		y := float64(v.backlog)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	n := float64(len(s))
	d := n*sxx - sx*sx
	if d == 0 {
		return 0, 0
	}
	return (n*sxy - sx*sy) / d, s[len(s)-1].at.Sub(t0)
}

// spark returns an inline SVG polyline of the partner's samples, ending
// with live, its backlog now (the page's backlog column), so that the chart
// and its title agree with the backlog the page shows: the samples alone
// are up to a sampling interval old. Its title gives the span, the maximum
// (of the samples and live) and live. An empty chart with fewer than two
// points.
func (t *trend) spark(partner string, now time.Time, live int) template.HTML {
	t.mu.Lock()
	s := append([]trendSample(nil), t.per[partner]...)
	t.mu.Unlock()
	if len(s) == 0 || now.After(s[len(s)-1].at) {
		s = append(s, trendSample{now, live})
	} else {
		s[len(s)-1].backlog = live // the clock did not move: now is the last sample
	}
	const w, h = 120, 24
	if len(s) < 2 {
		return template.HTML(fmt.Sprintf(`<svg class="spark" width="%d" height="%d"></svg>`, w, h))
	}
	top := 0
	for _, v := range s {
		top = max(top, v.backlog)
	}
	scale := max(top, 1) // an all-zero chart is a flat line at the bottom
	span := s[len(s)-1].at.Sub(s[0].at).Seconds()
	var pts strings.Builder
	for i, v := range s {
		x := float64(w-2) * float64(i) / float64(len(s)-1)
		if span > 0 {
			x = float64(w-2) * v.at.Sub(s[0].at).Seconds() / span
		}
		y := float64(h-2) - float64(h-4)*float64(v.backlog)/float64(scale)
		fmt.Fprintf(&pts, "%.1f,%.1f ", x+1, y)
	}
	return template.HTML(fmt.Sprintf(`<svg class="spark" width="%d" height="%d" viewBox="0 0 %d %d"><polyline fill="none" stroke="#36c" stroke-width="1.5" points="%s"/><title>backlog, last %s: max %d, now %d</title></svg>`,
		w, h, w, h, strings.TrimSpace(pts.String()), time.Duration(span*float64(time.Second)).Round(100*time.Millisecond), top, live))
}

// sample records the backlogs now.
func (s *Service) sample() {
	snap := s.backlog.snapshot(s.now())
	m := make(map[string]int, len(snap))
	for _, st := range snap {
		m[st.Partner] = st.Backlog
	}
	s.trend.add(s.now(), m)
}

// sampler samples the backlogs every trendEvery until stop closes.
func (s *Service) sampler(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	s.sample()
	t := time.NewTicker(s.cfg.trendEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			s.sample()
		}
	}
}
