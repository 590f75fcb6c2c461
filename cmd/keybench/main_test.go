package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/striped"
	"github.com/keysched/keysched/internal/trace"
)

// keybench runs in-process through run, with its outputs captured.
func runKeybench(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a watchdog only
	defer cancel()
	var out, errb bytes.Buffer
	code = run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

var jsonFields = []string{
	"scheduler", "events", "keys", "seconds", "events_per_sec", "p50_us", "p99_us", "p999_us",
	"cold_p99_us", "order_violations", "state_mismatches", "peak_goroutines", "peak_heap_bytes", "allocs_per_event",
	"neighbour_p99_us", "neighbour_events", "seed",
}

// parseJSONLines checks that every line is one object with exactly the
// documented fields, and returns them by scheduler.
func parseJSONLines(t *testing.T, stdout string) map[string]map[string]any {
	t.Helper()
	rows := map[string]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "line %q", line)
		var keys []string
		for k := range m {
			keys = append(keys, k)
		}
		require.ElementsMatch(t, jsonFields, keys, "fields of %s", line)
		name, ok := m["scheduler"].(string)
		require.True(t, ok)
		rows[name] = m
	}
	return rows
}

func TestJSONOnSample(t *testing.T) {
	code, stdout, stderr := runKeybench(t, "--json", "--limit", "3000", "--work", "none")
	require.Equal(t, 0, code, "stderr: %s", stderr)
	require.Empty(t, stderr, "no progress bar with --json")
	rows := parseJSONLines(t, stdout)
	require.Len(t, rows, len(rivals), "all rivals by default")
	for name, row := range rows {
		require.EqualValues(t, 3000, row["events"], name)
		require.Positive(t, row["keys"], name)
		require.Positive(t, row["events_per_sec"], name)
		require.Positive(t, row["peak_goroutines"], name)
		require.Positive(t, row["peak_heap_bytes"], name)
		require.LessOrEqual(t, row["p50_us"], row["p99_us"], name)
		require.LessOrEqual(t, row["p99_us"], row["p999_us"], name)
		if rivals[name].Ordered {
			require.EqualValues(t, 0, row["order_violations"], name)
			require.EqualValues(t, 0, row["state_mismatches"], name)
		}
	}
}

func TestJSONWithIOWorkAndSlowKey(t *testing.T) {
	code, stdout, stderr := runKeybench(t, "--json", "--limit", "2000", "--work", "io=100us",
		"--slow-key", "hottest", "--slow-factor", "5", "--workers", "8", "--schedulers", "chain,striped,pool")
	require.Equal(t, 0, code, "stderr: %s", stderr)
	rows := parseJSONLines(t, stdout)
	require.Len(t, rows, 3)
	for _, name := range []string{"chain", "striped"} {
		require.EqualValues(t, 0, rows[name]["order_violations"], name)
		require.EqualValues(t, 0, rows[name]["state_mismatches"], name)
	}
	// The pool promises no order; whether it shows violations on a run this
	// small is up to the machine, so it is logged, not asserted.
	t.Logf("pool: %v order violations, %v state mismatches", rows["pool"]["order_violations"], rows["pool"]["state_mismatches"])
	// 2000 events of io=100us on 8 workers take at least 25 ms.
	require.Greater(t, rows["chain"]["seconds"], 0.025)
}

func TestTableAndPlots(t *testing.T) {
	dir := t.TempDir()
	svg, pngPath := filepath.Join(dir, "k.svg"), filepath.Join(dir, "k.png")
	code, stdout, stderr := runKeybench(t, "--limit", "1500", "--work", "cpu=20us", "--workers", "4",
		"--schedulers", "chain,striped,pool", "--plot", svg)
	require.Equal(t, 0, code, "stderr: %s", stderr)
	require.Empty(t, stderr, "no progress bar when stderr is not a terminal")
	for _, want := range []string{"embedded sample", "1500 events", "hottest Makefile", "x20", "scheduler", "events/s",
		"cold p99", "violations", "chain", "striped", "pool", "chain vs striped", "plot written to"} {
		require.Contains(t, stdout, want)
	}
	require.NotContains(t, stdout, "goroutine-per-key", "--schedulers picks a subset")
	b, err := os.ReadFile(svg)
	require.NoError(t, err)
	require.Contains(t, string(b), "<svg")
	require.Contains(t, string(b), "striped")

	code, _, stderr = runKeybench(t, "--limit", "500", "--work", "none", "--schedulers", "chain,pool", "--json", "--plot", pngPath)
	require.Equal(t, 0, code, "stderr: %s", stderr)
	f, err := os.Open(pngPath)
	require.NoError(t, err)
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	require.NoError(t, err)
	require.Greater(t, cfg.Width, 1000)
}

func TestInputs(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "s.tsv")
	f, err := os.Create(p)
	require.NoError(t, err)
	require.NoError(t, trace.Write(f, trace.Sample()[:700]))
	require.NoError(t, f.Close())

	for _, args := range [][]string{
		{"--trace", p},
		{"--trace", p, "--rounds", "3", "--slow-key", "0/Makefile"},
		{"--synthetic", "--events", "3000", "--keys", "200", "--zipf", "1.2", "--seed", "3"},
		{"--synthetic", "--events", "3000", "--rate", "20000", "--slow-key", "none"},
	} {
		code, stdout, stderr := runKeybench(t, append(args, "--json", "--work", "none", "--schedulers", "chain,goroutine-per-key")...)
		require.Equal(t, 0, code, "%v: %s", args, stderr)
		rows := parseJSONLines(t, stdout)
		for name, row := range rows {
			require.EqualValues(t, 0, row["order_violations"], "%v %s", args, name)
			require.EqualValues(t, 0, row["state_mismatches"], "%v %s", args, name)
		}
		switch args[0] {
		case "--trace":
			if slices.Contains(args, "--rounds") {
				require.EqualValues(t, 2100, rows["chain"]["events"])
			} else {
				require.EqualValues(t, 700, rows["chain"]["events"])
			}
		case "--synthetic":
			require.EqualValues(t, 3000, rows["chain"]["events"])
		}
	}
}

func TestGitInput(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	if err := exec.Command("git", "-C", "../..", "rev-parse", "HEAD").Run(); err != nil {
		t.Skipf("the repository has no history here: %v", err)
	}
	code, stdout, stderr := runKeybench(t, "--git", "../..", "--json", "--work", "none", "--schedulers", "chain,striped")
	require.Equal(t, 0, code, stderr)
	rows := parseJSONLines(t, stdout)
	require.Positive(t, rows["chain"]["events"])
	require.EqualValues(t, 0, rows["chain"]["order_violations"])
	require.EqualValues(t, 0, rows["chain"]["state_mismatches"])
}

func TestBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--schedulers", "chain,lanes"}, `unknown scheduler "lanes"`},
		{[]string{"--schedulers", "chain,chain"}, `"chain" given twice`},
		{[]string{"--work", "disk=1ms"}, `--work "disk=1ms": want none, cpu=DUR or io=DUR`},
		{[]string{"--work", "io=fast"}, `"fast" is not a duration`},
		{[]string{"--work", "cpu=-1ms"}, "must be positive"},
		{[]string{"--trace", "/nonexistent/stream.tsv"}, "no such file or directory"},
		{[]string{"--git", "/nonexistent/repo"}, "git log in /nonexistent/repo failed"},
		{[]string{"--trace", "a", "--synthetic"}, "can't be used together"},
		{[]string{"--workers", "0"}, "--workers 0: need at least 1"},
		{[]string{"--workers", "many"}, "--workers"},
		{[]string{"--rounds", "0"}, "--rounds 0"},
		{[]string{"--rate=-5"}, "--rate -5"},
		{[]string{"--slow-factor", "0"}, "--slow-factor 0"},
		{[]string{"--slow-factor", "0.5"}, "--slow-factor 0.5: need a finite number >= 1"},
		{[]string{"--slow-factor=+Inf"}, "--slow-factor +Inf: need a finite number >= 1"},
		{[]string{"--synthetic", "--events", "0"}, "--events 0: need at least 1"},
		{[]string{"--slow-key", "no/such/file.c", "--limit", "100"}, `--slow-key "no/such/file.c": no event of the stream has that key`},
		{[]string{"--plot", "out.jpg"}, "--plot \"out.jpg\": the file name must end in .svg or .png"},
		{[]string{"--synthetic", "--keys", "0"}, "--keys 0"},
		{[]string{"--frobnicate"}, "unknown flag --frobnicate"},
		{[]string{"extra"}, "unexpected argument extra"},
	} {
		code, stdout, stderr := runKeybench(t, c.args...)
		require.NotEqual(t, 0, code, "%v", c.args)
		require.Contains(t, stderr, c.want, "%v", c.args)
		require.True(t, strings.HasPrefix(stderr, "keybench: "), "%v: %s", c.args, stderr)
		require.NotContains(t, stderr, "panic", "%v", c.args)
		require.NotContains(t, stdout, "scheduler  ", "%v: no table after an error", c.args)
	}
}

func TestHelp(t *testing.T) {
	code, stdout, _ := runKeybench(t, "--help")
	require.Equal(t, 0, code)
	for _, want := range []string{"--trace=FILE", "--git=DIR", "--synthetic", "--rounds=R", "--work=SPEC", "--slow-key=KEY",
		"--slow-factor=F", "--workers=N", "--rate=N", "--schedulers=NAME", "--json", "--plot=FILE", "(default io=200us)",
		"chain, striped, pool, goroutine-per-key, bus,"} {
		require.Contains(t, stdout, want)
	}
}

// The defaults that say "keysched's default" must stay so.
func TestDefaultsFollowKeysched(t *testing.T) {
	var c cli
	p, err := newParser(&c)
	require.NoError(t, err)
	_, err = p.Parse(nil)
	require.NoError(t, err)
	require.Equal(t, keysched.DefaultWorkers, c.Workers)
	require.Equal(t, keysched.DefaultMaxPending, c.Queue)
	require.Equal(t, keysched.DefaultMaxKeyDepth, c.KeyDepth)
	require.NoError(t, c.validate())
}

// The handler model sees reordering and tolerates concurrency within a key:
// it counts, it does not crash (run under -race).
func TestHandlerDetectsDisorder(t *testing.T) {
	events := trace.Sample()[:400]
	w := newWorkload(events, workSpec{kind: workNone}, "", 1, 0)
	var mk []int
	for i, e := range events {
		if e.Key == "Makefile" {
			mk = append(mk, i)
		}
	}
	require.GreaterOrEqual(t, len(mk), 3)

	// In order: clean.
	r := newReplay(w)
	for i := range events {
		r.handle(i)
	}
	require.Zero(t, r.violations.Load())
	require.Zero(t, r.mismatches())

	// Two events of Makefile swapped: both find the wrong state, and the key
	// ends in the wrong one when the later was its last.
	r = newReplay(w)
	a, b := mk[len(mk)-2], mk[len(mk)-1]
	for i := range events {
		switch i {
		case a:
			r.handle(b)
		case b:
			r.handle(a)
		default:
			r.handle(i)
		}
	}
	require.EqualValues(t, 2, r.violations.Load())
	require.Equal(t, 1, r.mismatches())

	// All events of every key at once, from many goroutines: no race, no
	// crash, every event handled once.
	r = newReplay(w)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < len(events); i += 8 {
				r.handle(i)
			}
		}()
	}
	wg.Wait()
	<-r.finished
	require.EqualValues(t, len(events), r.handled.Load())
}

// A rival registered from outside the built-in set (as the bus will be)
// runs like any other; this one runs each event inline, in order.
type inlineRival struct{}

func (inlineRival) Submit(_ context.Context, _ string, fn func()) error { fn(); return nil }
func (inlineRival) Close() error                                        { return nil }

func TestRegisterRival(t *testing.T) {
	register(rivalInfo{Name: "test-inline", Doc: "runs each event in Submit", Ordered: true, Order: 1000,
		New: func(rivalConfig) (rival, error) { return inlineRival{}, nil }})
	t.Cleanup(func() { delete(rivals, "test-inline") })
	require.Equal(t, "test-inline", rivalNames()[len(rivalNames())-1])
	require.Panics(t, func() { register(rivalInfo{Name: "chain", New: newChain}) }, "duplicate")
	require.Panics(t, func() { register(rivalInfo{Name: "Bad Name", New: newChain}) })

	code, stdout, stderr := runKeybench(t, "--json", "--limit", "1000", "--work", "none", "--schedulers", "test-inline")
	require.Equal(t, 0, code, stderr)
	rows := parseJSONLines(t, stdout)
	require.EqualValues(t, 0, rows["test-inline"]["order_violations"])
	require.EqualValues(t, 1000, rows["test-inline"]["events"])
}

// An ordered rival that breaks its promise makes keybench fail, after the
// table: a regression is not a benchmark result.
type swappingRival struct{ held func() }

func (s *swappingRival) Submit(_ context.Context, _ string, fn func()) error {
	if s.held == nil {
		s.held = fn
		return nil
	}
	fn()
	s.held()
	s.held = nil
	return nil
}
func (s *swappingRival) Close() error { return nil }

func TestBrokenOrderedRivalFails(t *testing.T) {
	register(rivalInfo{Name: "test-swap", Doc: "swaps each pair of events", Ordered: true, Order: 1001,
		New: func(rivalConfig) (rival, error) { return &swappingRival{}, nil }})
	t.Cleanup(func() { delete(rivals, "test-swap") })
	// Keys "k": every pair of consecutive events of one key is swapped.
	dir := t.TempDir()
	p := filepath.Join(dir, "one-key.tsv")
	ev, err := trace.Synthetic(1000, 1, 0, 1)
	require.NoError(t, err)
	f, err := os.Create(p)
	require.NoError(t, err)
	require.NoError(t, trace.Write(f, ev))
	require.NoError(t, f.Close())

	code, stdout, stderr := runKeybench(t, "--trace", p, "--work", "none", "--schedulers", "test-swap")
	require.Equal(t, exitFail, code)
	require.Contains(t, stdout, "test-swap", "the table is printed first")
	require.Contains(t, stderr, "test-swap promises per-key order but showed 1000 order violations")
}

// The neighbours are the keys that striped, under the run's seed, puts on the
// slow key's lane: with that key blocked, exactly they wait behind it on the
// striped rival keybench builds, and every other key runs.
func TestNeighboursShareTheSlowKeysLane(t *testing.T) {
	events := trace.Sample()[:3000]
	for _, seed := range []uint64{1, 2, 99} {
		const lanes = 8
		w := newWorkload(events, workSpec{kind: workNone}, "Makefile", 20, 0)
		nk := w.markNeighbours(seed, lanes)
		require.Positive(t, nk, "seed %d", seed)
		rv, err := newStriped(rivalConfig{Workers: lanes, Queue: lanes * len(w.keys), Seed: seed})
		require.NoError(t, err)
		ctx := context.Background()
		gate := make(chan struct{})
		require.NoError(t, rv.Submit(ctx, "Makefile", func() { <-gate }))
		ran := make([]chan struct{}, len(w.keys))
		for id, k := range w.keys {
			if int32(id) == w.slowID {
				continue
			}
			ran[id] = make(chan struct{})
			require.NoError(t, rv.Submit(ctx, k, func() { close(ran[id]) }))
		}
		for id := range w.keys {
			if ran[id] != nil && !w.neighbour[id] {
				<-ran[id] // its lane is free: it runs
			}
		}
		blocked := 0
		for id := range w.keys {
			if w.neighbour[id] {
				select {
				case <-ran[id]:
					t.Fatalf("seed %d: neighbour %s ran while the slow key held its lane", seed, w.keys[id])
				default:
					blocked++
				}
			}
		}
		require.Equal(t, nk, blocked)
		close(gate)
		require.NoError(t, rv.Close())
	}
	// The partition depends on the seed.
	a := newWorkload(events, workSpec{kind: workNone}, "Makefile", 20, 0)
	b := newWorkload(events, workSpec{kind: workNone}, "Makefile", 20, 0)
	a.markNeighbours(1, 8)
	b.markNeighbours(2, 8)
	require.NotEqual(t, a.neighbour, b.neighbour)
	require.Equal(t, striped.Lane(laneHash(7)("x"), 8), laneOf(7, 8, "x"))
}

// Every rival reports the neighbours' latency over the same events; the count
// is what the seed's partition gives, the same seed gives the same count, and
// the seed is in the output.
func TestNeighbourFigures(t *testing.T) {
	args := []string{"--json", "--limit", "2000", "--work", "none", "--workers", "8", "--seed", "5",
		"--schedulers", "chain,striped,pool"}
	code, stdout, stderr := runKeybench(t, args...)
	require.Equal(t, 0, code, stderr)
	rows := parseJSONLines(t, stdout)
	w := newWorkload(trace.Sample()[:2000], workSpec{kind: workNone}, "Makefile", 20, 0)
	w.markNeighbours(5, 8)
	want := 0
	for i := range w.events {
		if w.neighbour[w.ids[i]] {
			want++
		}
	}
	require.Positive(t, want)
	for name, row := range rows {
		require.EqualValues(t, want, row["neighbour_events"], name)
		require.Positive(t, row["neighbour_p99_us"], name)
		require.EqualValues(t, 5, row["seed"], name)
	}
	code, again, stderr := runKeybench(t, args...)
	require.Equal(t, 0, code, stderr)
	require.EqualValues(t, want, parseJSONLines(t, again)["chain"]["neighbour_events"])

	// No slow key, no neighbours.
	code, stdout, stderr = runKeybench(t, "--json", "--limit", "500", "--work", "none", "--slow-key", "none", "--schedulers", "chain")
	require.Equal(t, 0, code, stderr)
	row := parseJSONLines(t, stdout)["chain"]
	require.EqualValues(t, 0, row["neighbour_events"])
	require.EqualValues(t, 0, row["neighbour_p99_us"])
	require.NotZero(t, row["seed"], "a seed is drawn when none is given")
}

// The table's first result line is the neighbours' p99, with its count, and
// the header prints the seed so that the run can be repeated.
func TestHeadlineIsNeighbours(t *testing.T) {
	code, stdout, stderr := runKeybench(t, "--limit", "1500", "--work", "none", "--workers", "8", "--seed", "12345",
		"--schedulers", "chain,striped")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "seed     12345 (striped's lane hash; --seed 12345 repeats")
	_, results, ok := strings.Cut(stdout, "\n\n")
	require.True(t, ok)
	first := strings.SplitN(results, "\n", 2)[0]
	require.Regexp(t, `^neighbours p99: [1-9][0-9]* events of the [1-9][0-9]* keys that share Makefile's lane under striped \(seed 12345\)$`, first)
	require.Regexp(t, `chain vs striped: neighbours p99 x[0-9.]+\n`, results)
	require.Contains(t, results, "nbr p99")
}
