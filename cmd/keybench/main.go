// Command keybench is keysched's comparative benchmark: it replays a real
// keyed event stream through rival per-key schedulers (keysched's chains,
// striped lanes, a plain pool, a goroutine per key, a mutex per key), one
// after another in one process on the same stream, and prints what each
// costs and what it buys: throughput, per-event latency (overall, and for the
// keys other than a slow one), order violations, final-state mismatches
// against a sequential replay, peak goroutines and heap, allocations.
//
// With no flags it replays the sample embedded in the binary (the first
// 20,000 events of the git/git history) with io=200us of work per event and
// the hottest key 20 times slower:
//
//	go run ./cmd/keybench
//	go run ./cmd/keybench --trace cmd/keybench/data/git-history.tsv.gz --slow-factor 50
//	go run ./cmd/keybench --work none --rounds 5 --json
//	go run ./cmd/keybench --help
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alecthomas/kong"

	"github.com/keysched/keysched/internal/trace"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // the run failed, or an ordered rival broke its promise
	exitUsage = 2 // bad flags
)

// run is keybench with its arguments and outputs: main without the process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c cli
	exit := -1
	parser, err := newParser(&c, kong.Writers(stdout, stderr), kong.Exit(func(code int) {
		if exit < 0 {
			exit = code
		}
	}))
	if err != nil {
		fmt.Fprintf(stderr, "keybench: %v\n", err)
		return exitFail
	}
	_, err = parser.Parse(args)
	if exit >= 0 { // --help was printed
		return exit
	}
	if err == nil {
		err = c.validate()
	}
	if err != nil {
		fmt.Fprintf(stderr, "keybench: %v\nRun keybench --help for the flags.\n", strings.ReplaceAll(err.Error(), "\n", "\nkeybench: "))
		return exitUsage
	}
	if err := bench(ctx, &c, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "keybench: %v\n", err)
		return exitFail
	}
	return exitOK
}

// stream is the loaded input and what to call it.
type stream struct {
	events []trace.Event
	source string
}

func loadStream(ctx context.Context, c *cli) (stream, error) {
	var (
		s   stream
		err error
	)
	switch {
	case c.Trace != "":
		s.source = c.Trace
		s.events, err = trace.LoadFile(c.Trace)
	case c.Git != "":
		s.source = "git history of " + c.Git
		s.events, err = trace.FromGitContext(ctx, c.Git)
	case c.Synthetic:
		s.source = fmt.Sprintf("synthetic (%d events, %d keys, Zipf %g, seed %d)", c.Events, c.Keys, c.Zipf, c.Seed)
		s.events, err = trace.Synthetic(c.Events, c.Keys, c.Zipf, c.Seed)
	default:
		s.source = "embedded sample (git/git history, first 20,000 events)"
		s.events = trace.Sample()
	}
	if err != nil {
		return s, err
	}
	if c.Limit > 0 && c.Limit < len(s.events) {
		s.events = trace.Limit(s.events, c.Limit)
		s.source += fmt.Sprintf(", first %d events", c.Limit)
	}
	if c.Rounds > 1 {
		s.events = trace.Rounds(s.events, c.Rounds)
		s.source += fmt.Sprintf(", %d rounds", c.Rounds)
	}
	return s, nil
}

// bench loads the stream, runs every chosen rival on it and reports.
func bench(ctx context.Context, c *cli, stdout, stderr io.Writer) error {
	work, err := parseWork(c.Work)
	if err != nil {
		return err
	}
	chosen, err := pickRivals(c.Schedulers)
	if err != nil {
		return err
	}
	for c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	st, err := loadStream(ctx, c)
	if err != nil {
		return err
	}
	sum := trace.Summarize(st.events)
	slowKey := ""
	switch c.SlowKey {
	case "", "none":
	case "hottest":
		slowKey = sum.Hottest
	default:
		slowKey = c.SlowKey
	}
	w := newWorkload(st.events, work, slowKey, c.SlowFactor, c.Rate)
	if slowKey != "" && w.slowID < 0 {
		return fmt.Errorf("--slow-key %q: no event of the stream has that key", slowKey)
	}
	if c.SlowFactor == 1 {
		w.slowID = -1 // no slow key: cold p99 is p99
	}
	cfg := rivalConfig{Workers: c.Workers, Queue: c.Queue, KeyDepth: c.KeyDepth, Seed: c.Seed}
	info := runInfo{source: st.source, sum: sum, work: work, cfg: cfg, rate: c.Rate}
	if w.slowID >= 0 {
		info.neighbourKeys = w.markNeighbours(c.Seed, c.Workers)
	}
	if work.kind == workIO {
		info.ioWait = calibrateIO(work.dur)
	}
	if w.slowID >= 0 {
		info.slowKey, info.slowFactor = slowKey, c.SlowFactor
		info.slowEvents = countKey(st.events, slowKey)
	}

	if c.CPUProfile != "" {
		f, err := os.Create(c.CPUProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	showProgress := !c.JSON && isTerminal(stderr)
	if !c.JSON {
		writeHeader(stdout, info)
	}
	var results []result
	for _, r := range chosen {
		bar := newProgress(stderr, showProgress, len(st.events), r.Name)
		res, err := measure(ctx, w, r, cfg, func(done *atomic.Int64) { bar.start(done) })
		bar.finish()
		if err != nil {
			return err
		}
		results = append(results, res)
		if c.JSON {
			if err := writeJSON(stdout, res); err != nil {
				return err
			}
		}
	}
	if !c.JSON {
		writeTable(stdout, results, info)
	}
	if c.Plot != "" {
		if err := writePlot(c.Plot, results, info); err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
		if !c.JSON {
			fmt.Fprintf(stdout, "\nplot written to %s\n", c.Plot)
		}
	}
	var broken []error
	for _, r := range results {
		if r.ordered && (r.OrderViolations != 0 || r.StateMismatches != 0) {
			broken = append(broken, fmt.Errorf("%s promises per-key order but showed %d order violations and %d state mismatches",
				r.Scheduler, r.OrderViolations, r.StateMismatches))
		}
	}
	return errors.Join(broken...)
}

// calibrateIO measures what one io wait of d takes here, alone: the floor
// under the handler's work, printed in the header.
func calibrateIO(d time.Duration) time.Duration {
	const n = 20
	start := time.Now()
	for range n {
		waitIO(d)
	}
	return time.Since(start) / n
}

func countKey(events []trace.Event, key string) int {
	n := 0
	for i := range events {
		if events[i].Key == key {
			n++
		}
	}
	return n
}
