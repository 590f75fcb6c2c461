package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/keysched/keysched/internal/trace"
)

// runInfo describes a run for the header, the table's notes and the plot.
type runInfo struct {
	source     string
	sum        trace.Summary
	work       workSpec
	cfg        rivalConfig
	rate       float64
	slowKey    string // "" when there is none
	slowFactor float64
	slowEvents int
	ioWait     time.Duration // one io wait, measured alone; 0 if not io
	// neighbourKeys counts the keys that share the slow key's lane under
	// striped (cfg.Seed decides which).
	neighbourKeys int
}

func (ri runInfo) workText() string {
	s := "work " + ri.work.String()
	if ri.slowKey != "" {
		s += fmt.Sprintf(", slow key %s (%d events) x%g", ri.slowKey, ri.slowEvents, ri.slowFactor)
	}
	return s
}

func (ri runInfo) rateText() string {
	if ri.rate > 0 {
		return fmt.Sprintf("open loop at %g events/s", ri.rate)
	}
	return "closed loop (as fast as admission allows)"
}

func writeHeader(w io.Writer, ri runInfo) {
	fmt.Fprintf(w, "stream   %s: %d events, %d keys, hottest %s (%d events)\n",
		ri.source, ri.sum.Events, ri.sum.Keys, ri.sum.Hottest, ri.sum.HottestEvents)
	fmt.Fprintf(w, "handler  state check + %s\n", ri.workText())
	if ri.ioWait > 0 {
		fmt.Fprintf(w, "         (one io wait of %v takes %v here when alone)\n", ri.work.dur, ri.ioWait.Round(time.Microsecond))
	}
	fmt.Fprintf(w, "rivals   %d workers, queue %d, key depth %d (chain); %s; GOMAXPROCS %d\n",
		ri.cfg.Workers, ri.cfg.Queue, ri.cfg.KeyDepth, ri.rateText(), runtime.GOMAXPROCS(0))
	fmt.Fprintf(w, "seed     %d (striped's lane hash; --seed %d repeats this run's lanes)\n\n", ri.cfg.Seed, ri.cfg.Seed)
}

// writeHeadline prints the figure keysched exists for, first: the p99 latency
// of the slow key's neighbours (the keys that share its lane under striped)
// under each rival, with chain's ratio to striped's.
func writeHeadline(w io.Writer, results []result, ri runInfo) {
	if ri.slowKey == "" {
		return
	}
	events := 0
	if len(results) > 0 {
		events = results[0].NeighbourEvents
	}
	fmt.Fprintf(w, "neighbours p99: %d events of the %d keys that share %s's lane under striped (seed %d)\n",
		events, ri.neighbourKeys, ri.slowKey, ri.cfg.Seed)
	if events == 0 {
		fmt.Fprintf(w, "  none: no other key of the stream hashes onto that lane\n\n")
		return
	}
	var parts []string
	var chain, lanes float64
	for _, r := range results {
		parts = append(parts, fmt.Sprintf("%s %s", r.Scheduler, fmtUS(r.NeighbourP99us)))
		switch r.Scheduler {
		case "chain":
			chain = r.NeighbourP99us
		case "striped":
			lanes = r.NeighbourP99us
		}
	}
	fmt.Fprintf(w, "  %s\n", strings.Join(parts, ", "))
	if chain > 0 && lanes > 0 {
		fmt.Fprintf(w, "  chain vs striped: neighbours p99 x%.3f\n", chain/lanes)
	}
	fmt.Fprintln(w)
}

// writeTable prints the comparison table and, when chain ran with striped
// or pool, the ratios the design is judged by.
func writeTable(w io.Writer, results []result, ri runInfo) {
	writeHeadline(w, results, ri)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scheduler\tevents/s\tp50\tp99\tp99.9\tcold p99\tnbr p99\tviolations\tmismatches\tgoroutines\tpeak heap\tallocs/ev\tseconds\t")
	for _, r := range results {
		nbr := "-"
		if r.NeighbourEvents > 0 {
			nbr = fmtUS(r.NeighbourP99us)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%.2f\t%.2f\t\n",
			r.Scheduler, r.EventsPerSec, fmtUS(r.P50us), fmtUS(r.P99us), fmtUS(r.P999us), fmtUS(r.ColdP99us), nbr,
			r.OrderViolations, r.StateMismatches, r.PeakGoroutines, fmtBytes(r.PeakHeapBytes), r.AllocsPerEvent, r.Seconds)
	}
	tw.Flush()

	by := map[string]result{}
	for _, r := range results {
		by[r.Scheduler] = r
	}
	chain, ok := by["chain"]
	if !ok {
		return
	}
	var notes []string
	for _, name := range []string{"striped", "pool", "goroutine-per-key"} {
		o, ok := by[name]
		if !ok || o.EventsPerSec == 0 || o.ColdP99us == 0 {
			continue
		}
		note := fmt.Sprintf("chain vs %s: events/s x%.2f, cold p99 x%.3f", name, chain.EventsPerSec/o.EventsPerSec, chain.ColdP99us/o.ColdP99us)
		if o.NeighbourP99us > 0 {
			note += fmt.Sprintf(", neighbours p99 x%.3f", chain.NeighbourP99us/o.NeighbourP99us)
		}
		notes = append(notes, note+fmt.Sprintf(", allocs/ev %+.2f", chain.AllocsPerEvent-o.AllocsPerEvent))
	}
	if len(notes) > 0 {
		fmt.Fprintf(w, "\n%s\n", strings.Join(notes, "\n"))
	}
	fmt.Fprintf(w, "\nlatency: publish call to end of handler; cold p99: events of keys other than the slow one;\n")
	fmt.Fprintf(w, "nbr p99: events of the keys that share the slow key's lane under striped (its neighbours).\n")
	fmt.Fprintf(w, "violations: events that found their key in the wrong state; mismatches: keys whose final\n")
	fmt.Fprintf(w, "state differs from a sequential replay. pool and keyed-mutex promise no order.\n")
	if len(results) > 0 {
		fmt.Fprintf(w, "peak heap and goroutines count everything in the process: the live heap was %s before each run.\n",
			fmtBytes(results[0].baseHeap))
	}
}

// fmtUS formats microseconds for people.
func fmtUS(us float64) string {
	switch {
	case us < 1000:
		return fmt.Sprintf("%.0fus", us)
	case us < 1e6:
		return fmt.Sprintf("%.1fms", us/1e3)
	default:
		return fmt.Sprintf("%.2fs", us/1e6)
	}
}

func fmtBytes(b uint64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }

// writeJSON prints one rival's result as one line of JSON.
func writeJSON(w io.Writer, r result) error {
	round := func(v float64, digits int) float64 {
		p := math.Pow10(digits)
		return math.Round(v*p) / p
	}
	r.Seconds = round(r.Seconds, 6)
	r.EventsPerSec = round(r.EventsPerSec, 1)
	r.P50us, r.P99us, r.P999us, r.ColdP99us = round(r.P50us, 3), round(r.P99us, 3), round(r.P999us, 3), round(r.ColdP99us, 3)
	r.NeighbourP99us = round(r.NeighbourP99us, 3)
	r.AllocsPerEvent = round(r.AllocsPerEvent, 3)
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
