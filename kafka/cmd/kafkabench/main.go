// Command kafkabench produces a keyed event stream into a Kafka topic and
// consumes it with rival consumers, one after another in one process: the
// keysched Kafka adapter (KeyOrder), the same adapter with PartitionOrder,
// and a plain franz-go consumer that handles each partition's records one at
// a time on a goroutine of its own (the shape of franz-go's
// goroutine-per-partition example); and, on request (--consumers ideal),
// an ideal consumer with no broker and no adapter, the reference for the
// stream's work as it takes here. It reports, for each, events per second,
// p99 latency (from the poll that returned a record to the end of its
// handler), order violations, duplicates and CPU time per event, next to the
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
//	go run ./kafka/cmd/kafkabench --work io=1ms --partitions 8 --consumers ideal,keysched --hot-key
//
// --hot-key prints, for each consumer, where the hottest key's time went:
// its records' work, the gaps between them and why they waited.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/alecthomas/kong"
	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/trace"
	"github.com/keysched/keysched/kafka"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
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

	Work         string        `default:"io=1ms" placeholder:"SPEC" help:"Each handler's work: none; io=DUR (sleeps DUR, like a network call); cpu=DUR (a busy loop) (default ${default})."`
	Workers      int           `default:"256" placeholder:"N" help:"The adapter's workers (keysched.WithWorkers) (default ${default})."`
	MaxInFlight  int           `default:"4096" placeholder:"N" help:"The adapter's per-partition bound, WithMaxInFlight (default ${default})."`
	Consumers    []string      `default:"keysched,plain,keysched-partition" sep:"," placeholder:"NAME" help:"Consumers to run, in order: keysched, plain, keysched-partition, ideal (no broker: see runIdeal) (default ${default})."`
	FetchMaxWait time.Duration `name:"fetch-max-wait" default:"10ms" help:"The consumers' kgo.FetchMaxWait: how long the broker holds a fetch with no new records (10ms or more; default ${default}). Short: every idle fetch round trip wakes the process (with --work io=1ms, 1s ran the adapter 0.91-1.24 of the ideal consumer where 10ms ran 0.77-0.99, nine alternating pairs on 2026-12-01); long: a resumed partition waits for the fetch in flight (--work none --rounds 20: 500ms was slower in three pairs of three)."`
	Timeout      time.Duration `default:"10m" help:"Give up on a consumer that has not handled every event after this long (default ${default})."`
	JSON         bool          `name:"json" help:"One JSON object per consumer per line."`
	CPUProfile   string        `name:"cpuprofile" placeholder:"FILE" help:"Write a CPU profile of the consumers' runs to FILE."`
	HotKey       bool          `name:"hot-key" help:"After each consumer, print where the hottest key's time went: from the first polled record to its first record's start, its records' work, the gaps between them (split into: the next record not fetched yet, fetched but not polled, polled but not started) and the tail after its last record."`
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
	// HotKey is where the hottest key's time went (--hot-key).
	HotKey *HotKeyGaps `json:"hot_key,omitempty"`
}

// HotKeyGaps is where the run's time went for its hottest key, whose
// records run back to back are the bound when the hottest key is. Durations
// in ms: LeadIn + Work + NotFetched + NotPolled + NotStarted + Tail is the
// run's time.
type HotKeyGaps struct {
	Records int `json:"records"`
	// LeadIn: from the run's start (its first record polled) to the start
	// of the key's first record's work; Lead* split it like a gap.
	LeadIn         float64 `json:"lead_in_ms"`
	LeadNotFetched float64 `json:"lead_in_not_fetched_ms"`
	LeadNotPolled  float64 `json:"lead_in_not_polled_ms"`
	LeadNotStarted float64 `json:"lead_in_not_started_ms"`
	// Work: the key's records' work as it ran (the handler's call of the
	// work, summed); WorkMean per record; WorkBy100 the mean per record
	// of each hundred records in order (the first hundred ran while the
	// stream's other keys were busy too, see Running).
	Work      float64   `json:"work_ms"`
	WorkMean  float64   `json:"work_mean_ms"`
	WorkBy100 []float64 `json:"work_by_100_ms"`
	// Gaps between the end of one of its records and the start of the
	// next, split by what the next one waited for: NotFetched (not yet in
	// the client's buffer: fetch latency, a paused partition), NotPolled
	// (in the buffer, not yet handed to the adapter by a poll), NotStarted
	// (polled, not started: held, queued in the scheduler, the chain's
	// hand-off to a worker). GapsNotFetched and GapsNotPolled count the
	// gaps whose next record was not fetched, not polled, when the
	// previous one ended; GapsOver1ms the gaps longer than 1 ms, GapMax
	// the longest.
	NotFetched     float64 `json:"gap_not_fetched_ms"`
	NotPolled      float64 `json:"gap_not_polled_ms"`
	NotStarted     float64 `json:"gap_not_started_ms"`
	GapsNotFetched int     `json:"gaps_not_fetched"`
	GapsNotPolled  int     `json:"gaps_not_polled"`
	GapsOver1ms    int     `json:"gaps_over_1ms"`
	GapMax         float64 `json:"gap_max_ms"`
	// Tail: from the end of the key's last record to the end of the run.
	Tail float64 `json:"tail_ms"`
	// Running: the handlers (of every key) running, mean over each 50 ms
	// of the run.
	Running []float64 `json:"running_per_50ms"`
}

// hotKey splits the run's time for the hottest key (see HotKeyGaps).
func (t *tally) hotKey() *HotKeyGaps {
	n := make([]int, t.s.keys)
	hot := int32(0)
	for _, id := range t.s.ids {
		n[id]++
		if n[id] > n[hot] {
			hot = id
		}
	}
	var seqs []int
	for i, id := range t.s.ids {
		if id == hot {
			seqs = append(seqs, i)
		}
	}
	ms := func(ns int64) float64 { return float64(ns) / 1e6 }
	h := &HotKeyGaps{Records: len(seqs)}
	// split adds the wait from prev (ns) until seq's start to the three
	// parts: until fetched, until polled, until started.
	split := func(prev int64, seq int, f, p, s *float64) (fetched, polled bool) {
		b, pl, st := t.buffered[seq].Load(), t.polled[seq].Load(), t.began[seq]
		b = max(b, prev)
		pl = max(pl, b)
		*f += ms(b - prev)
		*p += ms(pl - b)
		*s += ms(st - pl)
		return b > prev, pl > prev
	}
	start, end := t.start.Load(), t.end.Load()
	split(start, seqs[0], &h.LeadNotFetched, &h.LeadNotPolled, &h.LeadNotStarted)
	h.LeadIn = ms(t.began[seqs[0]] - start)
	var hundred float64
	for i, seq := range seqs {
		w := ms(t.ended[seq] - t.began[seq])
		h.Work += w
		if hundred += w; i%100 == 99 || i == len(seqs)-1 {
			h.WorkBy100 = append(h.WorkBy100, hundred/float64(i%100+1))
			hundred = 0
		}
		if i == 0 {
			continue
		}
		prev := t.ended[seqs[i-1]]
		nf, np := split(prev, seq, &h.NotFetched, &h.NotPolled, &h.NotStarted)
		if nf {
			h.GapsNotFetched++
		} else if np {
			h.GapsNotPolled++
		}
		g := ms(t.began[seq] - prev)
		h.GapMax = max(h.GapMax, g)
		if g > 1 {
			h.GapsOver1ms++
		}
	}
	h.WorkMean = h.Work / float64(len(seqs))
	h.Tail = ms(end - t.ended[seqs[len(seqs)-1]])
	const bucket = int64(50 * time.Millisecond)
	h.Running = make([]float64, (end-start)/bucket+1)
	for seq := range t.began {
		for b := (t.began[seq] - start) / bucket; b >= 0 && b < int64(len(h.Running)); b++ {
			lo, hi := start+b*bucket, start+(b+1)*bucket
			o := min(hi, t.ended[seq]) - max(lo, t.began[seq])
			if o <= 0 {
				break
			}
			h.Running[b] += float64(o) / float64(bucket)
		}
	}
	return h
}

// printHotKey prints h, from consumer name's run.
func printHotKey(w io.Writer, name string, h *HotKeyGaps) {
	r := func(xs []float64, f string) string {
		var b strings.Builder
		for i, x := range xs {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, f, x)
		}
		return b.String()
	}
	run := h.LeadIn + h.Work + h.NotFetched + h.NotPolled + h.NotStarted + h.Tail
	fmt.Fprintf(w, "%s, hottest key (%d records) over the run's %.1f ms: lead-in %.1f ms (not fetched %.1f, not polled %.1f, not started %.1f); work %.1f ms (%.3f ms a record; by hundred records: %s); gaps %.1f ms (not fetched %.1f ms in %d gaps, not polled %.1f ms in %d, not started %.1f ms; %d over 1 ms, longest %.2f ms); tail %.1f ms\n",
		name, h.Records, run, h.LeadIn, h.LeadNotFetched, h.LeadNotPolled, h.LeadNotStarted, h.Work, h.WorkMean, r(h.WorkBy100, "%.3f"),
		h.NotFetched+h.NotPolled+h.NotStarted, h.NotFetched, h.GapsNotFetched, h.NotPolled, h.GapsNotPolled, h.NotStarted, h.GapsOver1ms, h.GapMax, h.Tail)
	fmt.Fprintf(w, "%s, handlers running (all keys), mean per 50 ms: %s\n", name, r(h.Running, "%.0f"))
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kafkabench:", err)
		os.Exit(1)
	}
}

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

func run(args []string, stdout, stderr io.Writer) error {
	var c cli
	parser, err := kong.New(&c, kong.Name("kafkabench"), kong.Writers(stdout, stderr),
		kong.Description("Produce a keyed stream into Kafka and consume it with rival consumers."))
	if err != nil {
		return err
	}
	if _, err := parser.Parse(args); err != nil {
		return err
	}
	work, err := parseWork(c.Work)
	if err != nil {
		return err
	}
	if c.Partitions < 1 || c.Workers < 1 || c.MaxInFlight < 1 || c.Limit < 0 || c.Rounds < 1 {
		return errors.New("--partitions, --workers, --max-in-flight and --rounds need at least 1, --limit 0 or more")
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
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	if !c.JSON {
		fmt.Fprintf(stdout, "%d events, %d keys, hottest key %d events, %d partitions, work %s, %d workers\n",
			len(events), s.keys, s.hottest, c.Partitions, c.Work, c.Workers)
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
	for i, name := range c.Consumers {
		cpu0 := cpuTime()
		r, err := s.consume(name, seeds, topic, fmt.Sprintf("%s-g%d", topic, i), &c, work)
		r.CPUSeconds = (cpuTime() - cpu0).Seconds()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		r.Partitions, r.BoundEventsPerSec = c.Partitions, bound
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
		plain, okp := results["plain"]
		for _, name := range []string{"keysched", "keysched-partition"} {
			if r, ok := results[name]; ok && okp {
				fmt.Fprintf(stdout, "%s / plain: %.2f of its events/s, %+.0f ns CPU per event\n", name,
					r.EventsPerSec/plain.EventsPerSec, r.CPUNsPerEvent-plain.CPUNsPerEvent)
			}
		}
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

// bound is the stream's best events/s with work w per event and the given
// workers: events / max(hottest key's events x w, events x w / workers).
func (s *stream) bound(w time.Duration, workers int) float64 {
	secs := max(float64(s.hottest)*w.Seconds(), float64(len(s.events))*w.Seconds()/float64(workers))
	return float64(len(s.events)) / secs
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

func loadEvents(c *cli) ([]trace.Event, error) {
	switch {
	case c.Trace != "":
		return trace.LoadFile(c.Trace)
	case c.Synthetic:
		return trace.Synthetic(c.Events, c.Keys, c.Zipf, c.Seed)
	}
	return trace.Sample(), nil
}

func createTopic(seeds []string, topic string, partitions int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, int32(partitions), -1
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		return err
	}
	return kerr.ErrorForCode(resp.Topics[0].ErrorCode)
}

// stream is the produced stream and what the consumers' handlers check
// against it.
type stream struct {
	events  []trace.Event
	ids     []int32 // key id of each event
	ord     []int32 // position of each event within its key
	keys    int
	hottest int
}

func newStream(events []trace.Event) *stream {
	ids, keys := trace.KeyIDs(events)
	s := &stream{events: events, ids: ids, ord: make([]int32, len(events)), keys: len(keys)}
	n := make([]int32, len(keys))
	for i, id := range ids {
		s.ord[i] = n[id]
		n[id]++
		s.hottest = max(s.hottest, int(n[id]))
	}
	return s
}

func produce(seeds []string, topic string, s *stream) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(100000))
	if err != nil {
		return err
	}
	defer cl.Close()
	var first atomic.Pointer[error]
	var wg sync.WaitGroup
	for i := range s.events {
		v := make([]byte, 8)
		binary.BigEndian.PutUint64(v, uint64(i))
		wg.Add(1)
		cl.Produce(context.Background(), &kgo.Record{Key: []byte(s.events[i].Key), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				first.CompareAndSwap(nil, &err)
			}
			wg.Done()
		})
	}
	wg.Wait()
	if e := first.Load(); e != nil {
		return *e
	}
	return nil
}

// tally is one consumer run's bookkeeping.
type tally struct {
	s      *stream
	work   workSpec
	polled []atomic.Int64 // when each event was first polled, Unix ns
	// With --hot-key alone (the time.Now calls cost a little): when each
	// event was first fetched into the client's buffer, and when its
	// (first) handler began and ended its work, Unix ns.
	hot        bool
	buffered   []atomic.Int64
	began      []int64
	ended      []int64
	handled    []atomic.Bool
	latency    []int64 // ns, first handling
	last       []atomic.Int32
	count      atomic.Int64
	dups       atomic.Int64
	violations atomic.Int64
	start      atomic.Int64
	end        atomic.Int64
	all        chan struct{}

	fetchReqs, fetchedRecs atomic.Int64 // see Result
}

func newTally(s *stream, work workSpec, hot bool) *tally {
	t := &tally{s: s, work: work, polled: make([]atomic.Int64, len(s.events)), handled: make([]atomic.Bool, len(s.events)),
		latency: make([]int64, len(s.events)), last: make([]atomic.Int32, s.keys), all: make(chan struct{})}
	for i := range t.last {
		t.last[i].Store(-1)
	}
	if hot {
		t.hot, t.buffered, t.began, t.ended = true, make([]atomic.Int64, len(s.events)), make([]int64, len(s.events)), make([]int64, len(s.events))
	}
	return t
}

// OnFetchRecordUnbuffered is the franz-go hook: a record leaves the client
// for the consumer.
func (t *tally) OnFetchRecordUnbuffered(r *kgo.Record, polled bool) {
	if !polled || len(r.Value) != 8 {
		return
	}
	now := time.Now().UnixNano()
	t.start.CompareAndSwap(0, now)
	seq := binary.BigEndian.Uint64(r.Value)
	if seq < uint64(len(t.polled)) {
		t.polled[seq].CompareAndSwap(0, now)
	}
}

// bufferedHook is the franz-go hook of --hot-key alone (no cost per
// record without it): a fetched record enters the client's buffer.
type bufferedHook struct{ t *tally }

func (h bufferedHook) OnFetchRecordBuffered(r *kgo.Record) {
	t := h.t
	if len(r.Value) != 8 {
		return
	}
	if seq := binary.BigEndian.Uint64(r.Value); seq < uint64(len(t.buffered)) {
		t.buffered[seq].CompareAndSwap(0, time.Now().UnixNano())
	}
}

// OnBrokerWrite is the franz-go hook: a request was written to a broker.
func (t *tally) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == kmsg.Fetch.Int16() && err == nil {
		t.fetchReqs.Add(1)
	}
}

// OnFetchBatchRead is the franz-go hook: a fetched batch was decoded.
func (t *tally) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	t.fetchedRecs.Add(int64(m.NumRecords))
}

func (t *tally) handle(_ context.Context, r *kgo.Record) error {
	if len(r.Value) != 8 {
		return nil
	}
	seq := binary.BigEndian.Uint64(r.Value)
	if seq >= uint64(len(t.s.events)) {
		return nil
	}
	id, ord := t.s.ids[seq], t.s.ord[seq]
	if last := t.last[id].Load(); ord > last+1 {
		t.violations.Add(1) // an earlier event of the key has not finished
	}
	var began, ended int64
	if t.hot {
		began = time.Now().UnixNano()
		t.work.do()
		ended = time.Now().UnixNano()
	} else {
		t.work.do()
	}
	for {
		last := t.last[id].Load()
		if ord <= last || t.last[id].CompareAndSwap(last, ord) {
			break
		}
	}
	if t.handled[seq].Swap(true) {
		t.dups.Add(1)
		return nil
	}
	now := time.Now().UnixNano()
	if t.hot {
		t.began[seq], t.ended[seq] = began, ended
	}
	t.latency[seq] = now - t.polled[seq].Load()
	if t.count.Add(1) == int64(len(t.s.events)) {
		t.end.Store(now)
		close(t.all)
	}
	return nil
}

func (t *tally) result(name string) Result {
	n := len(t.s.events)
	secs := float64(t.end.Load()-t.start.Load()) / 1e9
	lat := slices.Clone(t.latency)
	slices.Sort(lat)
	p99 := lat[min(n-1, int(math.Ceil(0.99*float64(n)))-1)]
	return Result{Consumer: name, Events: n, Seconds: secs, EventsPerSec: float64(n) / secs,
		P99us: float64(p99) / 1e3, OrderViolations: t.violations.Load(), Duplicates: t.dups.Load(),
		FetchRequests: t.fetchReqs.Load(), FetchedRecords: t.fetchedRecs.Load()}
}

func (s *stream) consume(name string, seeds []string, topic, group string, c *cli, work workSpec) (Result, error) {
	t := newTally(s, work, c.HotKey)
	copts := []kgo.Opt{
		kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.WithHooks(t),
		kgo.FetchMaxWait(c.FetchMaxWait),
	}
	if c.HotKey {
		copts = append(copts, kgo.WithHooks(bufferedHook{t}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	var err error
	switch name {
	case "plain":
		err = runPlain(ctx, copts, t)
	case "ideal":
		err = runIdeal(ctx, t, c.Workers)
	default:
		order := kafka.KeyOrder
		if name == "keysched-partition" {
			order = kafka.PartitionOrder
		}
		err = runAdapter(ctx, copts, t, order, c)
	}
	if err != nil {
		return Result{}, err
	}
	r := t.result(name)
	if c.HotKey {
		r.HotKey = t.hotKey()
	}
	return r, nil
}

func runAdapter(ctx context.Context, copts []kgo.Opt, t *tally, order kafka.Ordering, c *cli) error {
	cons, err := kafka.NewConsumer(t.handle, kafka.WithClientOptions(copts...), kafka.WithOrdering(order),
		kafka.WithMaxInFlight(c.MaxInFlight), kafka.WithCommitInterval(time.Second),
		kafka.WithSchedulerOptions(keysched.WithWorkers(c.Workers), keysched.WithMaxPending(max(keysched.DefaultMaxPending, c.MaxInFlight*c.Partitions))))
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	var werr error
	select {
	case <-t.all:
	case <-ctx.Done():
		werr = fmt.Errorf("handled %d of %d events before --timeout", t.count.Load(), len(t.s.events))
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	_ = cons.Close(cctx)
	if err := <-done; err != nil && werr == nil && !errors.Is(err, context.DeadlineExceeded) {
		werr = err
	}
	return werr
}

// runIdeal runs the stream's work as an ideal consumer would, with no
// broker and no adapter, in this process: every record at hand from the
// start, each key's records one after another on a goroutine of its own that
// holds one of the workers for the key's whole chain (no hand-off between
// its records), keys started in the order of their first record, at most
// workers at a time. It is what the stream's work takes here under the
// stream's own concurrency (up to workers handlers at once, then fewer as
// keys run out), which the measured bound (one call at a time, alone) does
// not see; its "of measured bound" says how much of that bound any consumer
// can reach here at that moment.
func runIdeal(ctx context.Context, t *tally, workers int) error {
	chains := make([][]int, t.s.keys)
	for seq, id := range t.s.ids {
		chains[id] = append(chains[id], seq)
	}
	sem := make(chan struct{}, workers)
	t.start.Store(time.Now().UnixNano())
	for _, chain := range chains {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("handled %d of %d events before --timeout", t.count.Load(), len(t.s.events))
		}
		go func() {
			defer func() { <-sem }()
			for _, seq := range chain {
				r := &kgo.Record{Value: binary.BigEndian.AppendUint64(nil, uint64(seq))}
				t.polled[seq].Store(t.start.Load())
				if t.hot {
					t.buffered[seq].Store(t.start.Load())
				}
				_ = t.handle(ctx, r)
			}
		}()
	}
	select {
	case <-t.all:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("handled %d of %d events before --timeout", t.count.Load(), len(t.s.events))
	}
}

// runPlain is franz-go's goroutine-per-partition consumer: the poll loop
// hands each partition's records to that partition's goroutine, which
// handles them one at a time and marks them for the next autocommit.
func runPlain(ctx context.Context, copts []kgo.Opt, t *tally) error {
	var (
		mu      sync.Mutex
		workers = map[int32]chan []*kgo.Record{}
		wg      sync.WaitGroup
	)
	stopAll := func() {
		mu.Lock()
		for p, ch := range workers {
			close(ch)
			delete(workers, p)
		}
		mu.Unlock()
		wg.Wait()
	}
	cl, err := kgo.NewClient(append(copts, kgo.AutoCommitMarks(), kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, _ map[string][]int32) {
			// One member: revokes come only with the final close.
			_ = cl.CommitMarkedOffsets(ctx)
		}))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	go func() {
		select {
		case <-t.all:
		case <-ctx.Done():
		}
		cl.CloseAllowingRebalance()
	}()
	for {
		fs := cl.PollRecords(ctx, 10000)
		if fs.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			mu.Lock()
			ch := workers[p.Partition]
			if ch == nil {
				ch = make(chan []*kgo.Record, 16)
				workers[p.Partition] = ch
				wg.Add(1)
				go func() {
					defer wg.Done()
					for rs := range ch {
						for _, r := range rs {
							_ = t.handle(ctx, r)
						}
						cl.MarkCommitRecords(rs...)
					}
				}()
			}
			mu.Unlock()
			ch <- p.Records
		})
		cl.AllowRebalance()
	}
	stopAll()
	select {
	case <-t.all:
		return nil
	default:
		return fmt.Errorf("handled %d of %d events before --timeout", t.count.Load(), len(t.s.events))
	}
}
