// Command kafkabench produces a keyed event stream into a Kafka topic and
// consumes it with rival consumers, one after another in one process: the
// keysched Kafka adapter (KeyOrder), the same adapter with PartitionOrder,
// and a plain franz-go consumer that handles each partition's records one at
// a time on a goroutine of its own (the shape of franz-go's
// goroutine-per-partition example); and, on request (--consumers ideal),
// an ideal consumer with no broker and no adapter, the reference for the
// stream's work as it takes here. It reports, for each, events per second,
// p99 latency (from the poll that returned a record to the end of its
// handler; of every event, or of about 100,000 picked by a hash of their
// position in streams longer than that), order violations, duplicates and CPU time per event, next to the
// stream's own bound: from the work as given (--work io=1ms) and from the
// work as measured on this machine (a 1 ms sleep takes longer).
//
// By default it starts an in-process kfake cluster; --brokers uses a real
// one (it creates the topic, named by --topic plus a random suffix, and
// leaves it).
//
//	go run ./kafka/cmd/kafkabench --work io=1ms --partitions 8 --trace cmd/keybench/data/git-history.tsv.gz
//	go run ./kafka/cmd/kafkabench --work io=1ms --partitions 8 --synthetic
//	go run ./kafka/cmd/kafkabench --work none --partitions 8 --json
//	go run ./kafka/cmd/kafkabench --work none --partitions 8 --rounds 40   # over a million records
//	go run ./kafka/cmd/kafkabench --work none --partitions 8 --rounds 50 --consumers keysched,plain --repeat 7
//	go run ./kafka/cmd/kafkabench --work io=1ms --partitions 8 --consumers ideal,keysched --hot-key
//
// --hot-key prints, for each consumer, where the hottest key's time went:
// its records' work, the gaps between them and why they waited.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/alecthomas/kong"
	"github.com/keysched/keysched/internal/trace"
	"github.com/twmb/franz-go/pkg/kfake"
)

type cli struct {
	Brokers    []string `sep:"," placeholder:"HOST:PORT" help:"Seed brokers of a real cluster (comma-separated). Default: an in-process kfake cluster."`
	Topic      string   `default:"kafkabench" help:"Topic name prefix; a random suffix is added (default ${default})."`
	Partitions int      `default:"8" placeholder:"P" help:"Partitions of the topic (default ${default})."`

	Trace     string  `placeholder:"FILE" xor:"source" help:"Produce the keyed stream in FILE (plain or gzipped TSV: seq, unix_time, commit, key, prev_blob, next_blob, status; e.g. cmd/keybench/data/git-history.tsv.gz). Default: the embedded sample, the first 20,000 events of the git/git history."`
	Synthetic bool    `xor:"source" help:"Generate the stream: --events events over --keys keys, key popularity Zipf(--zipf): many keys, mild skew."`
	Events    int     `default:"100000" placeholder:"N" help:"--synthetic: events (default ${default})."`
	Keys      int     `default:"10000" placeholder:"N" help:"--synthetic: distinct keys (default ${default})."`
	Zipf      float64 `default:"0.5" placeholder:"S" help:"--synthetic: Zipf exponent of key popularity; 0 is uniform (default ${default})."`
	Seed      uint64  `default:"1" placeholder:"N" help:"--synthetic: random seed (default ${default})."`
	Limit     int     `default:"0" placeholder:"N" help:"Use only the first N events; 0: all (default ${default})."`
	Rounds    int     `default:"1" placeholder:"R" help:"Produce the stream R times, one copy after another, keys prefixed with the round number (r/KEY): independent keys, a longer run (after --limit) (default ${default})."`

	Work           string        `default:"io=1ms" placeholder:"SPEC" help:"Each handler's work: none; io=DUR (sleeps DUR, like a network call); cpu=DUR (a busy loop) (default ${default})."`
	Workers        int           `default:"256" placeholder:"N" help:"The adapter's workers (keysched.WithWorkers) (default ${default})."`
	MaxInFlight    int           `default:"4096" placeholder:"N" help:"The adapter's per-partition bound, WithMaxInFlight (default ${default})."`
	Consumers      []string      `default:"keysched,plain,keysched-partition" sep:"," placeholder:"NAME" help:"Consumers to run, in order: keysched, plain, keysched-partition, ideal (no broker, no adapter: every record at hand, each key's records back to back on one of --workers goroutines) (default ${default})."`
	Repeat         int           `default:"1" placeholder:"R" help:"Run the --consumers list R times over, in order (keysched, plain, keysched, plain, ...) on the same stream. On a shared machine one run's keysched/plain ratio moves by a third from one run to the next: with R > 1 the summary gives each consumer's median events/s and the median and range of the ratios of the runs paired by repeat (default ${default})."`
	FetchMaxWait   time.Duration `name:"fetch-max-wait" default:"10ms" help:"The consumers' kgo.FetchMaxWait: how long the broker holds a fetch with no new records (10ms or more; default ${default}). Short: every idle fetch round trip wakes the process (with --work io=1ms, 1s ran the adapter 0.91-1.24 of the ideal consumer where 10ms ran 0.77-0.99, nine alternating pairs on 2026-12-01); long: a resumed partition waits for the fetch in flight (--work none --rounds 20: 500ms was slower in three pairs of three)."`
	FetchPartBytes int32         `name:"fetch-max-partition-bytes" default:"0" placeholder:"BYTES" help:"The consumers' kgo.FetchMaxPartitionBytes: how much one fetch returns of one partition; 0 keeps franz-go's default (1 MiB) (default ${default})."`
	Timeout        time.Duration `default:"10m" help:"Give up on a consumer that has not handled every event after this long (default ${default})."`
	JSON           bool          `name:"json" help:"One JSON object per consumer per line."`
	CPUProfile     string        `name:"cpuprofile" placeholder:"FILE" help:"Write a CPU profile of the consumers' runs to FILE."`
	MemProfile     string        `name:"memprofile" placeholder:"FILE" help:"Write an allocation profile of the whole process (producing the stream included) to FILE after the runs."`
	HotKey         bool          `name:"hot-key" help:"After each consumer, print where the hottest key's time went: from the first polled record to its first record's start, its records' work, the gaps between them (split into: the next record not fetched yet, fetched but not polled, polled but not started) and the tail after its last record."`
}

// syntheticOnly refuses a flag that shapes the generated stream (--events,
// --keys, --zipf, --seed) given without --synthetic: the stream read from
// --trace or the embedded sample has its own size and keys, and the flag
// would be ignored.
func syntheticOnly(kctx *kong.Context, synthetic bool) error {
	if synthetic {
		return nil
	}
	for _, p := range kctx.Path {
		if p.Flag == nil {
			continue
		}
		switch n := p.Flag.Name; n {
		case "events", "keys", "zipf", "seed":
			return fmt.Errorf("--%s applies to --synthetic only (the generated stream): the --trace file or the embedded sample has its own size and keys; add --synthetic, or drop --%s (for fewer events of a trace, --limit)", n, n)
		}
	}
	return nil
}

// Result is one consumer's run (the --json line).
type Result struct {
	Consumer          string  `json:"consumer"`
	Partitions        int     `json:"partitions"`
	Events            int     `json:"events"`
	Seconds           float64 `json:"seconds"`
	EventsPerSec      float64 `json:"events_per_sec"`
	BoundEventsPerSec float64 `json:"bound_events_per_sec"` // from the nominal work (--work); 0 with none
	// MeasuredWorkUs is one handler's work as measured here, alone (the
	// mean of sequential calls), around the consumer's run: the mean of
	// MeasuredWorkBeforeUs, measured just before it (after the previous
	// consumer), and MeasuredWorkAfterUs, just after it. On a shared
	// machine the same sleep takes 1.15 ms at one moment and 1.5 ms a few
	// seconds later: measured once before all the runs, as until
	// 2026-12-01, the bound of a run drifted by that much.
	// MeasuredBoundEventsPerSec is the bound from MeasuredWorkUs. 0 with
	// --work none.
	MeasuredWorkUs            float64 `json:"measured_work_us"`
	MeasuredWorkBeforeUs      float64 `json:"measured_work_before_us"`
	MeasuredWorkAfterUs       float64 `json:"measured_work_after_us"`
	MeasuredBoundEventsPerSec float64 `json:"measured_bound_events_per_sec"`
	P99us                     float64 `json:"p99_us"`
	OrderViolations           int64   `json:"order_violations"`
	Duplicates                int64   `json:"duplicates"`
	// CPUSeconds is the process's CPU time (user + system) during the
	// consumer's run, the in-process cluster's included: on a loaded
	// machine it compares consumers better than wall time; CPUNsPerEvent
	// is that per event.
	CPUSeconds    float64 `json:"cpu_seconds"`
	CPUNsPerEvent float64 `json:"cpu_ns_per_event"`
	// FetchRequests counts the Fetch requests the consumer's client sent,
	// FetchedRecords the records in the batches it read from their
	// answers. Records fetched more than once (a paused partition's
	// buffered records are dropped and fetched again on resume) make
	// FetchedRecords exceed Events.
	FetchRequests  int64 `json:"fetch_requests"`
	FetchedRecords int64 `json:"fetched_records"`
	// Repeat is the run's pass over the --consumers list, from 0
	// (--repeat).
	Repeat int `json:"repeat"`
	// HotKey is where the hottest key's time went (--hot-key).
	HotKey *HotKeyGaps `json:"hot_key,omitempty"`
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kafkabench:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	var c cli
	parser, err := kong.New(&c, kong.Name("kafkabench"), kong.Writers(stdout, stderr),
		kong.Description("Produce a keyed stream into Kafka and consume it with rival consumers."))
	if err != nil {
		return err
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		return err
	}
	if err := syntheticOnly(kctx, c.Synthetic); err != nil {
		return err
	}
	work, err := parseWork(c.Work)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name   string
		v, min int
	}{{"--partitions", c.Partitions, 1}, {"--workers", c.Workers, 1}, {"--max-in-flight", c.MaxInFlight, 1},
		{"--rounds", c.Rounds, 1}, {"--repeat", c.Repeat, 1}, {"--limit", c.Limit, 0}} {
		if f.v < f.min {
			return fmt.Errorf("%s %d: needs %d or more", f.name, f.v, f.min)
		}
	}
	if c.Timeout <= 0 {
		return fmt.Errorf("--timeout %v: needs to be positive", c.Timeout)
	}
	if len(c.Consumers) == 0 {
		return errors.New("--consumers: no consumer given (keysched, plain, keysched-partition, ideal)")
	}
	if c.FetchPartBytes < 0 {
		return fmt.Errorf("--fetch-max-partition-bytes=%d: need 0 (franz-go's default) or more", c.FetchPartBytes)
	}
	if c.FetchMaxWait < 10*time.Millisecond {
		return fmt.Errorf("--fetch-max-wait %v: franz-go takes 10ms or more", c.FetchMaxWait)
	}
	for _, name := range c.Consumers {
		if !slices.Contains([]string{"keysched", "plain", "keysched-partition", "ideal"}, name) {
			return fmt.Errorf("--consumers: unknown consumer %q", name)
		}
	}
	events, err := loadEvents(&c)
	if err != nil {
		return err
	}
	events = trace.Limit(events, c.Limit)
	if c.Rounds > 1 {
		events = trace.Rounds(events, c.Rounds)
	}
	if len(events) == 0 {
		return errors.New("the stream is empty")
	}
	s := newStream(events)

	seeds := c.Brokers
	topic := fmt.Sprintf("%s-%08x", c.Topic, rand.Uint32())
	if len(seeds) == 0 {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(c.Partitions), topic),
			kfake.GroupMinSessionTimeout(100*time.Millisecond))
		if err != nil {
			return err
		}
		defer cluster.Close()
		seeds = cluster.ListenAddrs()
	} else if err := createTopic(seeds, topic, c.Partitions); err != nil {
		return err
	}
	if err := produce(seeds, topic, s); err != nil {
		return err
	}
	// The stream's bound: it cannot end before its hottest key's events ran
	// one after another, nor before all events' work spread over the
	// workers. From the nominal work, and from the work as it takes here
	// (measured again after each consumer's run: see Result).
	bound, measured := 0.0, time.Duration(0)
	if work.kind != "none" {
		bound = s.bound(work.dur, c.Workers)
		measured = work.measure()
	}
	if c.CPUProfile != "" {
		f, err := os.Create(c.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if c.MemProfile != "" {
		f, err := os.Create(c.MemProfile)
		if err != nil {
			return err
		}
		defer func() {
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				fmt.Fprintln(stderr, "kafkabench: --memprofile:", err)
			}
			f.Close()
		}()
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	if !c.JSON {
		fmt.Fprintf(stdout, "%d events (%s), %d keys, hottest key %d events, %d partitions, work %s, %d workers\n",
			s.n, streamName(&c), s.keys, s.hottest, c.Partitions, c.Work, c.Workers)
		if work.kind == "none" {
			fmt.Fprintln(stdout, "no work: no bound (the bound columns are -); compare the consumers' events/s and CPU per event")
		}
		if measured > 0 {
			fmt.Fprintf(stdout, "one handler's work (%s) takes %v here when alone before the runs (the mean of calls for half a second); measured again after each run\n", c.Work, measured.Round(time.Microsecond))
		}
		fmt.Fprintln(tw, "consumer\tevents/s\tof bound\tof measured bound\tof bound measured before\tp99 µs\tseconds\tcpu ns/event\tfetched/event\torder violations\tduplicates\t")
	}
	results := map[string]Result{}
	type hotRun struct {
		name string
		h    *HotKeyGaps
	}
	var hot []hotRun        // in run order
	var idealRuns []float64 // events/s of each ideal run
	var ran []Result        // every run, in order (results keeps a name's last)

	order := make([]string, 0, c.Repeat*len(c.Consumers)) // the consumers of every run, in order
	for range c.Repeat {
		order = append(order, c.Consumers...)
	}
	for i, name := range order {
		cpu0 := cpuTime()
		r, err := s.consume(name, seeds, topic, fmt.Sprintf("%s-g%d", topic, i), &c, work)
		r.CPUSeconds = (cpuTime() - cpu0).Seconds()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		r.Partitions, r.BoundEventsPerSec, r.Repeat = c.Partitions, bound, i/len(c.Consumers)
		if work.kind != "none" {
			before := measured
			measured = work.measure()
			r.MeasuredWorkBeforeUs, r.MeasuredWorkAfterUs = float64(before)/1e3, float64(measured)/1e3
			r.MeasuredWorkUs = (r.MeasuredWorkBeforeUs + r.MeasuredWorkAfterUs) / 2
			r.MeasuredBoundEventsPerSec = s.bound(time.Duration(1e3*r.MeasuredWorkUs), c.Workers)
		}
		r.CPUNsPerEvent = 1e9 * r.CPUSeconds / float64(r.Events)
		results[name] = r
		ran = append(ran, r)
		if name == "ideal" {
			idealRuns = append(idealRuns, r.EventsPerSec)
		}
		if c.HotKey && !c.JSON {
			hot = append(hot, hotRun{name, r.HotKey})
		}
		if c.JSON {
			b, _ := json.Marshal(r)
			fmt.Fprintln(stdout, string(b))
		} else {
			of, ofm, ofb := "-", "-", "-"
			if bound > 0 {
				of = fmt.Sprintf("%.0f%%", 100*r.EventsPerSec/bound)
				ofm = fmt.Sprintf("%.0f%%", 100*r.EventsPerSec/r.MeasuredBoundEventsPerSec)
				ofb = fmt.Sprintf("%.0f%%", 100*r.EventsPerSec/s.bound(time.Duration(1e3*r.MeasuredWorkBeforeUs), c.Workers))
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%.0f\t%.2f\t%.0f\t%.2f\t%d\t%d\t\n", r.Consumer, r.EventsPerSec, of, ofm, ofb, r.P99us, r.Seconds,
				r.CPUNsPerEvent, float64(r.FetchedRecords)/float64(r.Events), r.OrderViolations, r.Duplicates)
		}
	}
	if !c.JSON {
		tw.Flush()
		for _, hr := range hot {
			printHotKey(stdout, hr.name, hr.h)
		}
		printRatios(stdout, ran, c.Repeat)
		if len(idealRuns) > 0 {
			mean := 0.0
			for _, e := range idealRuns {
				mean += e / float64(len(idealRuns))
			}
			for _, name := range []string{"keysched", "plain", "keysched-partition"} {
				if r, ok := results[name]; ok {
					fmt.Fprintf(stdout, "%s / ideal: %.2f of its events/s (ideal: mean of %d runs in this process)\n", name, r.EventsPerSec/mean, len(idealRuns))
				}
			}
		}
		if bound > 0 {
			fmt.Fprintf(stdout, "bound: %.0f events/s = events / max(hottest key's events x work, events x work / workers), work %v as given\n", bound, work.dur)
			for _, r := range ran {
				fmt.Fprintf(stdout, "%s: measured bound %.0f events/s, the same with the work as measured here alone around its run (%.3f ms: %.3f ms before, %.3f ms after)\n",
					r.Consumer, r.MeasuredBoundEventsPerSec, r.MeasuredWorkUs/1e3, r.MeasuredWorkBeforeUs/1e3, r.MeasuredWorkAfterUs/1e3)
			}
		}
	}
	return nil
}

// streamName says which stream the run produced, for the header.
func streamName(c *cli) string {
	var b strings.Builder
	switch {
	case c.Trace != "":
		b.WriteString(filepath.Base(c.Trace))
	case c.Synthetic:
		fmt.Fprintf(&b, "synthetic: %d keys, Zipf %g, seed %d", c.Keys, c.Zipf, c.Seed)
	default:
		b.WriteString("the embedded sample of the git/git history")
	}
	if c.Limit > 0 {
		fmt.Fprintf(&b, ", first %d", c.Limit)
	}
	if c.Rounds > 1 {
		fmt.Fprintf(&b, ", %d rounds", c.Rounds)
	}
	return b.String()
}
