package main

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"time"

	"github.com/alecthomas/kong"
)

// cli is keybench's command line. Every flag says its unit and default.
type cli struct {
	// Where the stream comes from: at most one of these; none means the
	// embedded sample.
	Trace     string  `placeholder:"FILE" xor:"source" group:"Stream" help:"Replay the keyed event stream in FILE, plain or gzipped TSV with the columns seq, unix_time, commit, key, prev_blob, next_blob, status (see the package doc of internal/trace; e.g. cmd/keybench/data/git-history.tsv.gz, the whole git/git history, from the repository root). Default: the sample embedded in keybench, the first 20,000 events of the git/git history."`
	Git       string  `placeholder:"DIR" xor:"source" group:"Stream" help:"Build the stream from the first-parent history (HEAD) of the git repository in DIR: one event per file changed per commit. Needs git 2.31+."`
	Synthetic bool    `xor:"source" group:"Stream" help:"Generate the stream: --events events over --keys keys, key popularity Zipf(--zipf), random seed --seed; same precondition chain as a real stream."`
	Events    int     `default:"200000" placeholder:"N" group:"Stream" help:"--synthetic: number of events (default ${default})."`
	Keys      int     `default:"10000" placeholder:"N" group:"Stream" help:"--synthetic: number of distinct keys (default ${default})."`
	Zipf      float64 `default:"1.1" placeholder:"S" group:"Stream" help:"--synthetic: Zipf exponent: the key of rank k is drawn with probability proportional to 1/k^S; 0 is uniform, 1 or more is heavily skewed (default ${default})."`
	Seed      uint64  `default:"0" placeholder:"N" group:"Stream" help:"The run's seed: striped's lane hash (which keys share the slow key's lane: its neighbours) and --synthetic's generator; the same seed gives the same lanes and the same stream. 0 draws one at random; the header prints it (default ${default})."`
	Rounds    int     `default:"1" placeholder:"R" group:"Stream" help:"Replay the stream R times, one copy after another, keys prefixed with the round number (r/KEY): independent chains, a longer run (default ${default})."`
	Limit     int     `default:"0" placeholder:"N" group:"Stream" help:"Replay only the first N events of the stream, before --rounds; 0 replays all (default ${default})."`

	Work       string  `default:"io=200us" placeholder:"SPEC" group:"Handler" help:"Work each handler does after its state check: none; cpu=DUR (a busy loop of DUR); io=DUR (sleeps DUR, like a network call). DUR is a Go duration: 200us, 1ms (default ${default})."`
	SlowKey    string  `default:"hottest" placeholder:"KEY" group:"Handler" help:"The hot, slow customer: this key's work takes --slow-factor times longer. A key of the stream, 'hottest' (the key with the most events) or 'none' (default ${default})."`
	SlowFactor float64 `default:"20" placeholder:"F" group:"Handler" help:"How many times longer the slow key's work is; 1 turns it off (default ${default})."`

	Workers    int      `default:"64" placeholder:"N" group:"Schedulers" help:"Size of every rival: keysched's pool, striped's lanes, the plain pools' workers (default ${default}, keysched's default)."`
	Queue      int      `default:"65536" placeholder:"N" group:"Schedulers" help:"Bound on accepted, unfinished events, for the rivals that bound them: keysched's WithMaxPending, striped's lane buffers (N/--workers each) (default ${default}, keysched's default)."`
	KeyDepth   int      `default:"1024" placeholder:"N" group:"Schedulers" help:"keysched's bound on one key's queued plus running events, WithMaxKeyDepth (default ${default}, keysched's default)."`
	Rate       float64  `default:"0" placeholder:"N" group:"Schedulers" help:"Publish N events per second, open loop: latency counts from each event's due time. 0 publishes as fast as admission allows, closed loop (default ${default})."`
	Schedulers []string `default:"all" sep:"," placeholder:"NAME" group:"Schedulers" help:"Rivals to run, one after another in this order: ${rivals}; or all (default ${default})."`

	JSON       bool   `name:"json" group:"Output" help:"Print one JSON object per rival per line instead of the table (and no progress bar)."`
	Plot       string `placeholder:"FILE" group:"Output" help:"Also draw the latency distribution of every rival and their throughput, side by side, to FILE (.svg or .png)."`
	CPUProfile string `name:"cpuprofile" placeholder:"FILE" group:"Output" help:"Write a CPU profile of the runs to FILE, for go tool pprof."`
}

const description = `keybench replays a keyed event stream through rival per-key schedulers, one
after another in one process, and compares what isolation costs (throughput,
allocations, goroutines, memory) with what it buys (order, and the latency of
the keys that are not the slow one, and of its neighbours).

Each event's handler checks that its key is in the state the event expects
(an order violation if not), applies the event, then does the --work, which
is --slow-factor times longer for the --slow-key. Latency is per event, from
the publish call to the end of its handler; cold p99 is over the events of
every key but the slow one. state_mismatches counts keys whose final state
differs from a sequential replay.`

// newParser builds the kong parser for c.
func newParser(c *cli, opts ...kong.Option) (*kong.Kong, error) {
	opts = append([]kong.Option{
		kong.Name("keybench"),
		kong.Description(description),
		kong.Vars{"rivals": strings.Join(rivalNames(), ", ")},
		kong.ConfigureHelp(kong.HelpOptions{Compact: true, NoExpandSubcommands: true}),
	}, opts...)
	return kong.New(c, opts...)
}

// Work kinds.
const (
	workNone = iota
	workCPU
	workIO
)

// workSpec is a parsed --work.
type workSpec struct {
	kind int
	dur  time.Duration
}

func (w workSpec) String() string {
	switch w.kind {
	case workCPU:
		return "cpu=" + w.dur.String()
	case workIO:
		return "io=" + w.dur.String()
	}
	return "none"
}

// parseWork parses none, cpu=DUR or io=DUR.
func parseWork(s string) (workSpec, error) {
	s = strings.TrimSpace(s)
	if s == "none" {
		return workSpec{kind: workNone}, nil
	}
	kindS, durS, ok := strings.Cut(s, "=")
	var kind int
	switch {
	case ok && kindS == "cpu":
		kind = workCPU
	case ok && kindS == "io":
		kind = workIO
	default:
		return workSpec{}, fmt.Errorf("--work %q: want none, cpu=DUR or io=DUR (e.g. io=200us)", s)
	}
	d, err := time.ParseDuration(durS)
	if err != nil {
		return workSpec{}, fmt.Errorf("--work %q: %q is not a duration (e.g. 200us, 1ms)", s, durS)
	}
	if d <= 0 {
		return workSpec{}, fmt.Errorf("--work %q: the duration must be positive (or use --work none)", s)
	}
	return workSpec{kind: kind, dur: d}, nil
}

// validate checks the flags that kong does not, with messages that name the
// flag and say what it takes.
func (c *cli) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Workers < 1 {
		bad("--workers %d: need at least 1", c.Workers)
	}
	if c.Queue < 1 {
		bad("--queue %d: need at least 1", c.Queue)
	}
	if c.KeyDepth < 1 {
		bad("--key-depth %d: need at least 1", c.KeyDepth)
	}
	if c.Rounds < 1 {
		bad("--rounds %d: need at least 1", c.Rounds)
	}
	if c.Limit < 0 {
		bad("--limit %d: need 0 (all) or more", c.Limit)
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		bad("--rate %v: need 0 (as fast as admission allows) or a positive number of events per second", c.Rate)
	}
	if !(c.SlowFactor >= 1) || math.IsInf(c.SlowFactor, 0) {
		bad("--slow-factor %v: need a finite number >= 1, how many times longer the slow key's work is (1 turns the slow key off)", c.SlowFactor)
	}
	if c.Synthetic {
		if c.Events < 1 {
			bad("--events %d: need at least 1", c.Events)
		}
		if c.Keys < 1 {
			bad("--keys %d: need at least 1", c.Keys)
		}
		if c.Zipf < 0 || math.IsNaN(c.Zipf) || math.IsInf(c.Zipf, 0) {
			bad("--zipf %v: need a finite number >= 0", c.Zipf)
		}
	}
	if _, err := parseWork(c.Work); err != nil {
		errs = append(errs, err)
	}
	if _, err := pickRivals(c.Schedulers); err != nil {
		errs = append(errs, err)
	}
	if c.Plot != "" {
		switch strings.ToLower(filepath.Ext(c.Plot)) {
		case ".svg", ".png":
		default:
			bad("--plot %q: the file name must end in .svg or .png", c.Plot)
		}
	}
	return errors.Join(errs...)
}
