package main

import (
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// keybench's rate and work durations saturate (issue 8, class 1): for every
// --rate, --work and --slow-factor that validate accepts, the work is never
// negative (a huge factor used to wrap to a negative duration: no work at
// all for the "slow" key), and due times never go negative or backwards (a
// tiny rate overflowed int64).
func TestWorkAndDueDurationsSaturate(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := &cli{Workers: 1, Queue: 1, KeyDepth: 1, Rounds: 1, Schedulers: []string{"chain"}, Work: "none"}
		c.Rate = rapid.OneOf(rapid.Float64(), rapid.SampledFrom([]float64{0, 1e-300, math.SmallestNonzeroFloat64, 1e-9, 1, 1e300, math.MaxFloat64})).Draw(t, "rate")
		c.SlowFactor = rapid.OneOf(rapid.Float64(), rapid.SampledFrom([]float64{1, 50, 1e19, 1e300, math.MaxFloat64, math.SmallestNonzeroFloat64})).Draw(t, "slowFactor")
		d := time.Duration(rapid.OneOf(rapid.Int64Range(1, 1<<40), rapid.SampledFrom([]int64{1, math.MaxInt64, math.MaxInt64 / 2})).Draw(t, "work"))
		c.Work = "io=" + d.String()
		if c.validate() != nil {
			return // refused with a message: nothing to compute
		}
		spec, err := parseWork(c.Work)
		if err != nil {
			t.Fatal(err)
		}
		w := &workload{work: spec, slowID: 7, slowFactor: c.SlowFactor, rate: c.Rate}
		if got := w.workFor(7); got < 0 {
			t.Fatalf("slow key's work %d < 0 (work %v, factor %v)", got, d, c.SlowFactor)
		} else if c.SlowFactor >= 1 && got < spec.dur {
			t.Fatalf("slow key's work %v < the work %v with factor %v", got, spec.dur, c.SlowFactor)
		}
		if got := w.workFor(3); got != spec.dur {
			t.Fatalf("other key's work %v, want %v", got, spec.dur)
		}
		prev := int64(0)
		for _, i := range []int{0, 1, 2, 1000, 96875, math.MaxInt32, math.MaxInt} {
			due := w.dueAt(i)
			if due < prev {
				t.Fatalf("rate %v: event %d due at %d, before event's earlier %d", c.Rate, i, due, prev)
			}
			prev = due
		}
	})
	// The inputs that wrapped.
	w := &workload{work: workSpec{kind: workIO, dur: time.Second}, slowID: 0, slowFactor: 1e19, rate: 1e-300}
	if got := w.workFor(0); got != math.MaxInt64 {
		t.Fatalf("1s x 1e19 = %d, want saturated", got)
	}
	if got := w.dueAt(1); got != math.MaxInt64 {
		t.Fatalf("rate 1e-300: event 1 due at %d, want saturated", got)
	}
}
