// Command kafkareplay republishes chosen records of a dead-letter topic
// written by the keysched Kafka adapter to their original topic and
// partition (kafka.Replay). It is run on purpose, after the code or the data
// was fixed; nothing runs it automatically.
//
//	kafkareplay --brokers localhost:9092 --dlq orders.dlq --error timeout --since 2h --dry-run
//	kafkareplay --brokers localhost:9092 --dlq orders.dlq --error timeout --since 2h
//
// It reads the dead-letter topic to its end as it was when it started,
// selects by the filters (all ANDed), and validates every selected record
// before writing any: a record that is not one of the adapter's dead
// letters, an original topic or partition that does not exist, a record
// replayed --max-replays times already, or filters that match nothing make
// it write nothing and exit with status 3. --dry-run prints what would be
// written, one line per record, and the counts. Otherwise it writes them
// (idempotent producer, waiting for every acknowledgement) and prints one
// line per record written.
//
// Exit status: 0 done; 1 failed while reading or writing (the output says
// which records were written: a per-partition prefix); 2 bad flags; 3 bad
// input, refused before anything was written.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/keysched/keysched/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
)

type cli struct {
	Brokers []string `required:"" sep:"," placeholder:"HOST:PORT" help:"Seed brokers (comma-separated)."`
	TLS     bool     `name:"tls" help:"Connect with TLS (the system's roots)."`

	DLQ           string  `name:"dlq" required:"" placeholder:"TOPIC" help:"The dead-letter topic to read."`
	DLQPartitions []int32 `name:"dlq-partition" sep:"," placeholder:"P" help:"Its partitions to read (comma-separated; default: all)."`
	Offsets       string  `placeholder:"FROM-TO" help:"Its offsets to read in each partition, both ends included: 17-42, 17-, 17 or --offsets=-42 (default: all)."`

	Topics     []string `name:"topic" sep:"," placeholder:"TOPIC" help:"Select records failed in these original topics (comma-separated; default: any)."`
	Partitions []int32  `name:"partition" sep:"," placeholder:"P" help:"Select records failed in these original partitions (comma-separated; default: any)."`
	Since      string   `placeholder:"TIME" help:"Select records whose --time is at or after TIME: RFC 3339 (2026-12-01T13:00:00Z) or a duration before now (90m)."`
	Until      string   `placeholder:"TIME" help:"Select records whose --time is before TIME (same forms as --since)."`
	Time       string   `enum:"record,failure" default:"record" help:"Which time --since and --until filter on: record (the failed record's timestamp) or failure (when it was dead-lettered) (default ${default})."`
	Keys       []string `name:"key" sep:"none" placeholder:"KEY" help:"Select records with this key (repeatable; default: any)."`
	Error      string   `placeholder:"TEXT" help:"Select records whose error message contains TEXT."`

	MaxReplays int           `default:"3" placeholder:"N" help:"Refuse records already replayed N times (default ${default})."`
	DryRun     bool          `help:"List what would be written, and write nothing."`
	Timeout    time.Duration `default:"1m" help:"Give up after this long (default ${default})."`
}

// Exit statuses.
const (
	exitOK       = 0
	exitFailed   = 1
	exitUsage    = 2
	exitRefused  = 3
	usagePrefix  = "usage: "
	refusedClass = "refused: "
)

// usageError is a bad flag.
type usageError struct{ error }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(report(err, os.Stderr))
}

// report prints err to w and returns the exit status.
func report(err error, w io.Writer) int {
	if err == nil {
		return exitOK
	}
	var refused *kafka.ReplayRefusedError
	var usage usageError
	switch {
	case errors.As(err, &usage) || errors.Is(err, kafka.ErrInvalidOption):
		fmt.Fprintf(w, "kafkareplay: %s%v (see --help)\n", usagePrefix, err)
		return exitUsage
	case errors.As(err, &refused):
		letters := "dead letters"
		if len(refused.Problems) == 1 {
			letters = "dead letter"
		}
		fmt.Fprintf(w, "kafkareplay: %snothing written: %d selected %s cannot be replayed:\n", refusedClass, len(refused.Problems), letters)
		for _, p := range refused.Problems {
			fmt.Fprintf(w, "  %s: %v\n", p.At, p.Err)
		}
		return exitRefused
	case errors.Is(err, kafka.ErrUnknownTopic) || errors.Is(err, kafka.ErrNothingToReplay):
		fmt.Fprintf(w, "kafkareplay: %snothing written: %v\n", refusedClass, err)
		return exitRefused
	}
	fmt.Fprintf(w, "kafkareplay: %v\n", err)
	return exitFailed
}

// helpShown is what kong's exit panics with after --help.
type helpShown struct{}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	var c cli
	parser, err := kong.New(&c, kong.Name("kafkareplay"), kong.Writers(stdout, stderr),
		kong.Description("Republish chosen records of a keysched dead-letter topic to their original topic and partition."),
		kong.Exit(func(int) { panic(helpShown{}) }))
	if err != nil {
		return err
	}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(helpShown); !ok {
				panic(r)
			}
			err = nil
		}
	}()
	if err := emptyFilter(args); err != nil {
		return usageError{err}
	}
	if _, err := parser.Parse(args); err != nil {
		return usageError{err}
	}
	o, err := c.options(time.Now())
	if err != nil {
		return usageError{err}
	}
	clientOpts := []kgo.Opt{kgo.SeedBrokers(c.Brokers...), kgo.FetchMaxWait(500 * time.Millisecond)}
	if c.TLS {
		clientOpts = append(clientOpts, kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}))
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	rep, err := kafka.Replay(ctx, o, clientOpts...)
	if rep != nil && (err == nil || len(rep.Records) > 0) {
		print(stdout, rep)
	}
	return err
}

// filterFlags are the flags whose empty value would mean "no filter": given
// empty (a script's unset variable, --topic "$TOPIC"), they would widen the
// selection to everything. --key "" is a filter (the empty key); --error ""
// is refused too: leave the flag out to match any message.
var filterFlags = []string{"--dlq-partition", "--offsets", "--topic", "--partition", "--since", "--until", "--error"}

// emptyFilter refuses a filter flag given an empty value.
func emptyFilter(args []string) error {
	for i, a := range args {
		if a == "--" {
			return nil
		}
		for _, f := range filterFlags {
			if a == f+"=" || a == f && i+1 < len(args) && args[i+1] == "" {
				return fmt.Errorf("%s given an empty value: it would select everything (leave the flag out for that)", f)
			}
		}
	}
	return nil
}

// options turns the flags into kafka.ReplayOptions.
func (c *cli) options(now time.Time) (kafka.ReplayOptions, error) {
	o := kafka.ReplayOptions{
		DeadLetterTopic:      c.DLQ,
		DeadLetterPartitions: c.DLQPartitions,
		Topics:               c.Topics,
		Partitions:           c.Partitions,
		ErrorContains:        c.Error,
		MaxReplays:           c.MaxReplays,
		DryRun:               c.DryRun,
	}
	// franz-go takes an empty seed for localhost:9092: "$A,$B" with A
	// unset, or a doubled comma, would add whatever cluster listens there.
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			return o, fmt.Errorf("--brokers %q: an empty broker address (a doubled comma, or an unset variable?)", strings.Join(c.Brokers, ","))
		}
	}
	if c.MaxReplays < 1 {
		return o, fmt.Errorf("--max-replays %d: want 1 or more", c.MaxReplays)
	}
	if c.Timeout <= 0 {
		return o, fmt.Errorf("--timeout %v: want a positive duration", c.Timeout)
	}
	if c.Time == "failure" {
		o.TimeOf = kafka.FailureTime
	}
	var err error
	if o.StartOffset, o.EndOffset, err = parseOffsets(c.Offsets); err != nil {
		return o, err
	}
	if o.Since, err = parseTime("--since", c.Since, now); err != nil {
		return o, err
	}
	if o.Until, err = parseTime("--until", c.Until, now); err != nil {
		return o, err
	}
	for _, k := range c.Keys {
		o.Keys = append(o.Keys, []byte(k))
	}
	return o, nil
}

// parseOffsets parses FROM-TO (both included), FROM-, -TO or N into
// [start, end) (end 0: no bound).
func parseOffsets(s string) (start, end int64, err error) {
	if s == "" {
		return 0, 0, nil
	}
	bad := fmt.Errorf("--offsets %q: want FROM-TO, FROM-, -TO or N (non-negative offsets, both ends included)", s)
	from, to, ok := strings.Cut(s, "-")
	if !ok {
		to = from
	}
	if from != "" {
		if start, err = strconv.ParseInt(from, 10, 64); err != nil || start < 0 {
			return 0, 0, bad
		}
	}
	if to != "" {
		last, err := strconv.ParseInt(to, 10, 64)
		if err != nil || last < 0 || last == 1<<63-1 {
			return 0, 0, bad
		}
		if last < start {
			return 0, 0, fmt.Errorf("--offsets %q: FROM %d is above TO %d (want FROM-TO with FROM <= TO, both ends included)", s, start, last)
		}
		end = last + 1
	}
	if from == "" && to == "" {
		return 0, 0, bad
	}
	return start, end, nil
}

// parseTime parses an RFC 3339 time or a positive duration before now.
func parseTime(flag, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%s %q: want an RFC 3339 time (2026-12-01T13:00:00Z) or a positive duration before now (90m)", flag, s)
}

// print writes the report: one line per selected record, then the counts.
func print(w io.Writer, rep *kafka.ReplayReport) {
	for _, r := range rep.Records {
		d := &r.DeadLetter
		orig := position(kafka.Position{Topic: d.Topic, Partition: d.Partition, Offset: d.Offset})
		switch {
		case rep.DryRun || len(rep.Problems) > 0:
			fmt.Fprintf(w, "would replay %s key=%s attempts=%d replays=%d error=%q from=%s failed=%s\n",
				orig, quoteKey(r.Key), d.Attempts, d.Replays, d.Error, r.From, r.FailedAt.UTC().Format(time.RFC3339))
		case r.Err != nil:
			fmt.Fprintf(w, "NOT written %s key=%s from=%s: %v\n", orig, quoteKey(r.Key), r.From, r.Err)
		default:
			fmt.Fprintf(w, "wrote %s key=%s replay=%d from=%s (failed as %s)\n", position(r.Written), quoteKey(r.Key), r.Replay, r.From, orig)
		}
	}
	for _, p := range rep.Duplicates {
		fmt.Fprintf(w, "duplicate %s left out (another dead letter of the same record is selected)\n", p)
	}
	counts := fmt.Sprintf("(read %d dead letters, %d duplicates left out, %d refused)", rep.Scanned, len(rep.Duplicates), len(rep.Problems))
	if rep.DryRun || len(rep.Problems) > 0 {
		fmt.Fprintf(w, "would replay %d records, wrote none %s\n", len(rep.Records), counts)
	} else {
		fmt.Fprintf(w, "replayed %d of %d records %s\n", rep.Written, len(rep.Records), counts)
	}
}

// position prints p, its topic quoted unless it is plain text: the
// original topic comes from a dead letter's header, which any producer of
// the dead-letter topic writes (a newline or a terminal escape in it would
// forge output lines).
func position(p kafka.Position) string {
	if q := strconv.Quote(p.Topic); q[1:len(q)-1] != p.Topic || strings.ContainsAny(p.Topic, "/@ ") {
		return fmt.Sprintf("%s/%d@%d", q, p.Partition, p.Offset)
	}
	return p.String()
}

func quoteKey(k []byte) string {
	if k == nil {
		return "<nil>"
	}
	return strconv.Quote(string(k))
}
