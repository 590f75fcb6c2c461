package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/HdrHistogram/hdrhistogram-go"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	_ "gonum.org/v1/plot/vg/vgimg" // registers png
	_ "gonum.org/v1/plot/vg/vgsvg" // registers svg
)

// writePlot draws three panels side by side to path (.svg or .png): the
// latency distribution of every rival over all events, the same over the
// cold keys (all but the slow one), and the throughput of every rival.
// Latencies are drawn against percentiles on a "nines" axis (50%, 90%, 99%,
// 99.9%, ...), so the tail gets the room it deserves.
func writePlot(path string, results []result, ri runInfo) (err error) {
	defer func() {
		// gonum/plot panics on some degenerate inputs; report, don't crash.
		if r := recover(); r != nil {
			err = fmt.Errorf("drawing the plot: %v", r)
		}
	}()
	if len(results) == 0 || ri.sum.Events == 0 {
		return fmt.Errorf("nothing to plot: no events")
	}
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")

	all := latencyPlot("latency, all events", results, func(r result) *hdrhistogram.Histogram { return r.hist })
	coldTitle := "latency, cold keys"
	if ri.slowKey != "" {
		coldTitle = "latency, keys other than " + ri.slowKey
	}
	cold := latencyPlot(coldTitle, results, func(r result) *hdrhistogram.Histogram { return r.cold })
	thr, err := throughputPlot(results, ri)
	if err != nil {
		return err
	}

	const w, h = 15 * vg.Inch, 5 * vg.Inch
	c, err := draw.NewFormattedCanvas(w, h, format)
	if err != nil {
		return err
	}
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: 1, Cols: 3, PadX: vg.Inch / 3, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 8}
	plots := [][]*plot.Plot{{all, cold, thr}}
	canvases := plot.Align(plots, tiles, dc)
	for i, p := range plots[0] {
		p.Draw(canvases[0][i])
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// nines maps a percentile q (0..100) to the x axis: 0 at 0%, 1 at 90%,
// 2 at 99%, 3 at 99.9%.
func nines(q float64) float64 { return -math.Log10(1 - q/100) }

func latencyPlot(title string, results []result, hist func(result) *hdrhistogram.Histogram) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "percentile"
	p.Y.Label.Text = "latency (ms, log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	// Curves rise to the right: the bottom right corner is free.
	p.Legend.Top = false
	p.Legend.Left = false
	p.Legend.YOffs = vg.Points(6)
	maxX := 1.0
	for i, r := range results {
		h := hist(r)
		if h == nil || h.TotalCount() == 0 {
			continue
		}
		// Up to the percentile where one event is left: beyond, it is the max.
		top := math.Min(math.Log10(float64(h.TotalCount())), 6)
		maxX = math.Max(maxX, top)
		var xys plotter.XYs
		for x := 0.0; x <= top+1e-9; x += 0.02 {
			q := 100 * (1 - math.Pow(10, -x))
			ms := math.Max(float64(h.ValueAtPercentile(q))/1e6, 1e-3)
			xys = append(xys, plotter.XY{X: x, Y: ms})
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			continue
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		l.Dashes = plotutil.Dashes(i)
		p.Add(l)
		p.Legend.Add(r.Scheduler, l)
	}
	ticks := []plot.Tick{{Value: 0}, {Value: nines(50), Label: "50%"}}
	labels := []string{"", "90%", "99%", "99.9%", "99.99%", "99.999%", "99.9999%"}
	for i := 1; i <= int(math.Ceil(maxX)) && i < len(labels); i++ {
		ticks = append(ticks, plot.Tick{Value: float64(i), Label: labels[i]})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = 0, maxX
	p.Add(plotter.NewGrid())
	return p
}

func throughputPlot(results []result, ri runInfo) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "throughput"
	p.Y.Label.Text = "events per second"
	p.X.Label.Text = fmt.Sprintf("%d events, %s", ri.sum.Events, ri.workText())
	vals := make(plotter.Values, len(results))
	names := make([]string, len(results))
	for i, r := range results {
		vals[i], names[i] = r.EventsPerSec, r.Scheduler
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(28))
	if err != nil {
		return nil, err
	}
	bars.Color = color.RGBA{R: 0x4c, G: 0x72, B: 0xb0, A: 0xff}
	bars.LineStyle.Width = 0
	p.Add(bars)
	top := 0.0
	xys := make(plotter.XYs, len(results))
	texts := make([]string, len(results))
	for i, v := range vals {
		xys[i] = plotter.XY{X: float64(i), Y: v}
		texts[i] = humanCount(v)
		top = math.Max(top, v)
	}
	labels, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
	if err != nil {
		return nil, err
	}
	for i := range labels.TextStyle {
		labels.TextStyle[i].XAlign = draw.XCenter
	}
	labels.Offset = vg.Point{Y: vg.Points(3)}
	p.Add(labels)
	p.NominalX(names...)
	p.Y.Tick.Marker = plot.TickerFunc(func(min, max float64) []plot.Tick {
		ts := plot.DefaultTicks{}.Ticks(min, max)
		for i := range ts {
			if ts[i].Label != "" {
				ts[i].Label = humanCount(ts[i].Value)
			}
		}
		return ts
	})
	p.Y.Max = top * 1.12
	p.X.Tick.Label.Rotation = math.Pi / 8
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YCenter
	p.Y.Min = 0
	return p, nil
}

// humanCount formats a rate for a label: 950, 12.5k, 3.1M.
func humanCount(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.3gk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}
