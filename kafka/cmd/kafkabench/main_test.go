package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A tiny run of every consumer, so the benchmark cannot rot: the JSON lines
// carry the documented fields, every event is handled, none out of order.
func TestTinyRun(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run([]string{"--synthetic", "--events", "150", "--rounds", "2", "--keys", "20", "--work", "io=100us", "--partitions", "2",
		"--workers", "8", "--json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	sc := bufio.NewScanner(&out)
	var names []string
	var after float64
	for sc.Scan() {
		var fields map[string]any
		if err := json.Unmarshal(sc.Bytes(), &fields); err != nil {
			t.Fatalf("%q: %v", sc.Text(), err)
		}
		for _, f := range []string{"consumer", "partitions", "events", "seconds", "events_per_sec", "bound_events_per_sec",
			"p99_us", "order_violations", "duplicates", "measured_work_us", "measured_bound_events_per_sec",
			"cpu_seconds", "cpu_ns_per_event", "fetch_requests", "fetched_records", "measured_work_before_us", "measured_work_after_us", "repeat"} {
			if _, ok := fields[f]; !ok {
				t.Errorf("line %q lacks %s", sc.Text(), f)
			}
		}
		if len(fields) != 18 {
			t.Errorf("line %q: %d fields, want 18", sc.Text(), len(fields))
		}
		var r Result
		_ = json.Unmarshal(sc.Bytes(), &r)
		// --rounds 2: the 150 events twice, keys prefixed per round. The
		// work is measured: a 100µs sleep takes at least 100µs.
		if r.Events != 300 || r.Partitions != 2 || r.OrderViolations != 0 || r.EventsPerSec <= 0 || r.BoundEventsPerSec <= 0 ||
			r.MeasuredWorkUs < 100 || r.MeasuredBoundEventsPerSec <= 0 || r.MeasuredBoundEventsPerSec > r.BoundEventsPerSec || r.CPUNsPerEvent <= 0 ||
			r.FetchRequests < 1 || r.FetchedRecords < int64(r.Events) {
			t.Errorf("result %+v", r)
		}
		// The bound scales with 1/work: the measured bound is the
		// nominal one times 100µs / the measured work.
		if want := r.BoundEventsPerSec * 100 / r.MeasuredWorkUs; math.Abs(r.MeasuredBoundEventsPerSec-want) > want/100 {
			t.Errorf("measured bound %.0f, want %.0f (work %.1fµs)", r.MeasuredBoundEventsPerSec, want, r.MeasuredWorkUs)
		}
		// The work is measured around each run: before it (after the
		// previous run) and after it; the bound is from their mean.
		if r.MeasuredWorkBeforeUs < 100 || r.MeasuredWorkAfterUs < 100 ||
			math.Abs(r.MeasuredWorkUs-(r.MeasuredWorkBeforeUs+r.MeasuredWorkAfterUs)/2) > 0.01 ||
			(len(names) > 0 && r.MeasuredWorkBeforeUs != after) {
			t.Errorf("measured work %.1fµs, before %.1fµs (the previous run's after: %.1fµs), after %.1fµs",
				r.MeasuredWorkUs, r.MeasuredWorkBeforeUs, after, r.MeasuredWorkAfterUs)
		}
		after = r.MeasuredWorkAfterUs
		names = append(names, r.Consumer)
	}
	if strings.Join(names, ",") != "keysched,plain,keysched-partition" {
		t.Errorf("consumers %v", names)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--work", "io=-1ms"},
		{"--work", "sleep"},
		{"--partitions", "0"},
		{"--rounds", "0"},
		{"--repeat", "0"},
		{"--limit", "-1"},
		{"--timeout", "0s"},
		{"--consumers", ""},
		{"--consumers", "nope"},
		{"--fetch-max-wait", "5ms"},
		{"--fetch-max-partition-bytes=-1"},
		{"--synthetic", "--trace", "x"},
	} {
		var out, errOut bytes.Buffer
		// Refused, naming the flag.
		if err := run(args, &out, &errOut); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(args[0], "--")) {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// The flags that shape the generated stream, given without --synthetic,
// would be ignored (the trace or the embedded sample has its own size):
// refused before any stream is made, naming the flag and --synthetic.
func TestSyntheticFlagsWithoutSyntheticRefused(t *testing.T) {
	for _, c := range []struct {
		flag string
		args []string
	}{
		{"--events", []string{"--events", "1000000"}},
		{"--events", []string{"--events=1000000", "--trace", "x"}},
		{"--keys", []string{"--limit", "10", "--keys", "5"}},
		{"--zipf", []string{"--zipf", "1"}},
		{"--seed", []string{"--seed", "2"}},
	} {
		var out, errOut bytes.Buffer
		if err := run(c.args, &out, &errOut); err == nil || !strings.Contains(err.Error(), c.flag+" applies to --synthetic only") {
			t.Errorf("%v: %v", c.args, err)
		}
	}
}

// --hot-key and the ideal consumer: the hottest key's time splits into
// lead-in, work, gaps and tail that add up to the run's time; the ideal
// consumer handles every event, in order, with no broker.
func TestHotKeyAndIdealRun(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run([]string{"--synthetic", "--events", "100", "--keys", "10", "--zipf", "1.5", "--work", "io=1ms", "--partitions", "2",
		"--workers", "8", "--consumers", "ideal,keysched", "--hot-key", "--json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	sc := bufio.NewScanner(&out)
	var names []string
	for sc.Scan() {
		var r Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%q: %v", sc.Text(), err)
		}
		names = append(names, r.Consumer)
		h := r.HotKey
		if r.Events != 100 || r.OrderViolations != 0 || r.Duplicates != 0 || h == nil || h.Records < 2 {
			t.Fatalf("result %s", sc.Text())
		}
		sum := h.LeadIn + h.Work + h.NotFetched + h.NotPolled + h.NotStarted + h.Tail
		if runMs := 1e3 * r.Seconds; math.Abs(sum-runMs) > 0.01 || h.Work < float64(h.Records) || len(h.WorkBy100) != (h.Records+99)/100 {
			t.Errorf("%s: lead-in + work + gaps + tail %.3f ms, run %.3f ms; hot key %+v", r.Consumer, sum, runMs, h)
		}
	}
	if strings.Join(names, ",") != "ideal,keysched" {
		t.Errorf("consumers %v", names)
	}
	out.Reset()
	if err := run([]string{"--synthetic", "--events", "20", "--keys", "5", "--work", "io=1ms", "--partitions", "1",
		"--consumers", "ideal", "--hot-key"}, &out, &errOut); err != nil || !strings.Contains(out.String(), "ideal, hottest key (") {
		t.Errorf("table output: %v\n%s", err, out.String())
	}
}

// --memprofile writes an allocation profile that pprof reads.
func TestMemProfileIsWritten(t *testing.T) {
	f := filepath.Join(t.TempDir(), "mem.prof")
	var out, errOut bytes.Buffer
	if err := run([]string{"--synthetic", "--events", "20", "--keys", "5", "--work", "none", "--partitions", "1",
		"--consumers", "keysched", "--memprofile", f}, &out, &errOut); err != nil {
		t.Fatalf("run: %v\n%s", err, errOut.String())
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	// A pprof profile is a gzipped protobuf that names its sample types.
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("--memprofile wrote no gzipped profile (%d bytes): %v", len(b), err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, []byte("alloc_space")) {
		t.Fatalf("not an allocation profile (%d bytes)", len(raw))
	}
}
