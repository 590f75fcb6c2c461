package main

import (
	"fmt"
	"io"
	"slices"
)

// printRatios prints each adapter consumer against the plain consumer:
// with one repeat, the ratio of their events/s and the difference of their
// CPU per event; with more (--repeat), each consumer's median events/s and
// range, and the median and range of the ratios and CPU differences of the
// runs paired by repeat (the k-th keysched run with the k-th plain run, run
// next to each other). ran holds every run in order.
func printRatios(w io.Writer, ran []Result, repeats int) {
	byName := map[string][]Result{}
	var names []string
	for _, r := range ran {
		if _, ok := byName[r.Consumer]; !ok {
			names = append(names, r.Consumer)
		}
		byName[r.Consumer] = append(byName[r.Consumer], r)
	}
	if repeats > 1 {
		for _, name := range names {
			rs := byName[name]
			eps := make([]float64, len(rs))
			for i, r := range rs {
				eps[i] = r.EventsPerSec
			}
			lo, hi := minMax(eps)
			fmt.Fprintf(w, "%s: median %.0f events/s over %d runs (%.0f to %.0f)\n", name, median(eps), len(rs), lo, hi)
		}
	}
	plain := byName["plain"]
	for _, name := range []string{"keysched", "keysched-partition"} {
		rs := byName[name]
		n := min(len(rs), len(plain))
		if n == 0 {
			continue
		}
		ratios, cpu := make([]float64, n), make([]float64, n)
		for i := range n {
			ratios[i] = rs[i].EventsPerSec / plain[i].EventsPerSec
			cpu[i] = rs[i].CPUNsPerEvent - plain[i].CPUNsPerEvent
		}
		if n == 1 {
			fmt.Fprintf(w, "%s / plain: %.2f of its events/s, %+.0f ns CPU per event\n", name, ratios[0], cpu[0])
			continue
		}
		rlo, rhi := minMax(ratios)
		clo, chi := minMax(cpu)
		fmt.Fprintf(w, "%s / plain: median %.2f of its events/s (%.2f to %.2f over %d pairs), median %+.0f ns CPU per event (%+.0f to %+.0f)\n",
			name, median(ratios), rlo, rhi, n, median(cpu), clo, chi)
	}
}

// median returns the median of xs (the mean of the middle two when their
// count is even); xs is not changed. 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func minMax(xs []float64) (lo, hi float64) {
	return slices.Min(xs), slices.Max(xs)
}
