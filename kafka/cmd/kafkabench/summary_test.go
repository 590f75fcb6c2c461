package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// --repeat runs the consumer list that many times over, in order, each run
// stamped with its repeat; every run handles the whole stream.
func TestRepeatRunsTheListOver(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run([]string{"--synthetic", "--events", "60", "--keys", "6", "--work", "none", "--partitions", "2",
		"--workers", "4", "--consumers", "keysched,plain", "--repeat", "2", "--json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var got []string
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var r Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%q: %v", sc.Text(), err)
		}
		if r.Events != 60 || r.OrderViolations != 0 || r.Duplicates != 0 {
			t.Errorf("result %s", sc.Text())
		}
		got = append(got, fmt.Sprintf("%s/%d", r.Consumer, r.Repeat))
	}
	if want := "keysched/0,plain/0,keysched/1,plain/1"; strings.Join(got, ",") != want {
		t.Errorf("runs %v, want %s", got, want)
	}
}

// The summary pairs the runs by repeat: the k-th keysched run with the
// k-th plain run. The medians of each consumer's own runs would give
// 2/2 = 1.00 here; the pairs' ratios are 0.5, 1.5 and 0.5.
func TestRatiosArePairedByRepeat(t *testing.T) {
	var ran []Result
	for i, eps := range [][2]float64{{1, 2}, {3, 2}, {2, 4}} {
		ran = append(ran, Result{Consumer: "keysched", EventsPerSec: eps[0], CPUNsPerEvent: 1000 + float64(i), Repeat: i},
			Result{Consumer: "plain", EventsPerSec: eps[1], CPUNsPerEvent: 500, Repeat: i})
	}
	var out bytes.Buffer
	printRatios(&out, ran, 3)
	for _, want := range []string{
		"keysched: median 2 events/s over 3 runs (1 to 3)\n",
		"plain: median 2 events/s over 3 runs (2 to 4)\n",
		"keysched / plain: median 0.50 of its events/s (0.50 to 1.50 over 3 pairs), median +501 ns CPU per event (+500 to +502)\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	printRatios(&out, ran[:2], 1)
	if want := "keysched / plain: 0.50 of its events/s, +500 ns CPU per event\n"; out.String() != want {
		t.Errorf("one run: %q, want %q", out.String(), want)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
