package main

import (
	"fmt"
	"strings"
	"syscall"
	"time"
)

type workSpec struct {
	kind string // none, io, cpu
	dur  time.Duration
}

func parseWork(s string) (workSpec, error) {
	if s == "none" {
		return workSpec{kind: "none"}, nil
	}
	k, d, ok := strings.Cut(s, "=")
	if !ok || (k != "io" && k != "cpu") {
		return workSpec{}, fmt.Errorf("--work %q: want none, io=DUR or cpu=DUR", s)
	}
	dur, err := time.ParseDuration(d)
	if err != nil || dur <= 0 {
		return workSpec{}, fmt.Errorf("--work %q: %q is not a positive duration", s, d)
	}
	return workSpec{kind: k, dur: dur}, nil
}

func (w workSpec) do() {
	switch w.kind {
	case "io":
		// time.Sleep, not keybench's timerfd: that costs two system calls
		// per wait, and on a shared 2-core machine it made the consumers
		// CPU-bound (synthetic stream: 21-29k events/s against 59-80k).
		time.Sleep(w.dur)
	case "cpu":
		for end := time.Now().Add(w.dur); time.Now().Before(end); {
		}
	}
}

// measure returns the mean duration of one call of the work, alone (calls
// one after another on one goroutine): what a time.Sleep(1ms) costs here
// (timer slack, scheduling on a loaded machine), not what it was asked for.
// It calls the work for about half a second (20 to 2,000 calls): by the
// clock, not by the nominal work, since a short sleep takes far longer than
// asked (100µs takes about 1.1 ms here).
func (w workSpec) measure() time.Duration {
	start := time.Now()
	n := 0
	for n < 2000 && (n < 20 || time.Since(start) < 500*time.Millisecond) {
		w.do()
		n++
	}
	return time.Since(start) / time.Duration(n)
}

// cpuTime is the process's CPU time so far (0 where getrusage is missing).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
