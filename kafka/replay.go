package kafka

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/optcheck"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DefaultMaxReplays is ReplayOptions.MaxReplays's default: a record already
// replayed 3 times is refused.
const DefaultMaxReplays = 3

// Replay's sentinel errors; compare with errors.Is.
var (
	// ErrUnknownTopic: the dead-letter topic, or a selected record's
	// original topic or partition, does not exist (also returned by
	// Consumer.Run for a WithDeadLetterTopic the cluster lacks).
	ErrUnknownTopic = errors.New("kafka: unknown topic or partition")
	// ErrReplayLimit: a selected record was replayed MaxReplays times
	// already.
	ErrReplayLimit = errors.New("kafka: replay limit reached")
	// ErrNothingToReplay: the filters matched no dead letter.
	ErrNothingToReplay = errors.New("kafka: no dead letter matches")
	// ErrReplayIncomplete: some selected records were not written (the
	// report's Records say which).
	ErrReplayIncomplete = errors.New("kafka: replay incomplete")
	// ErrReplayTooLarge: a selected record, with its replay headers, is
	// larger than the client's kgo.ProducerBatchMaxBytes (or
	// kgo.MaxBufferedBytes): franz-go would fail it alone and write the
	// partition's later records.
	ErrReplayTooLarge = errors.New("kafka: replay record too large")
)

// TimeOf says which time ReplayOptions.Since and Until filter on.
type TimeOf int

const (
	// RecordTime is the failed record's own timestamp (the dead letter's
	// HeaderTimestamp).
	RecordTime TimeOf = iota
	// FailureTime is the dead letter's timestamp: when it was written.
	FailureTime
)

// ReplayOptions choose the dead letters Replay republishes. Every filter
// left at its zero value selects everything; the filters are ANDed.
type ReplayOptions struct {
	// DeadLetterTopic is the topic to read (required).
	DeadLetterTopic string
	// DeadLetterPartitions are its partitions to read (one named twice is
	// read once); none: all.
	DeadLetterPartitions []int32
	// StartOffset and EndOffset bound the offsets read in each
	// dead-letter partition: [StartOffset, EndOffset). EndOffset 0 means
	// the partition's end when Replay starts (records written meanwhile
	// are not read). Offsets below a partition's log start are skipped.
	StartOffset, EndOffset int64

	// Topics and Partitions select by the failed record's original topic
	// and partition; none: any.
	Topics     []string
	Partitions []int32
	// Since (inclusive) and Until (exclusive) bound the time chosen by
	// TimeOf; zero: unbounded.
	Since, Until time.Time
	TimeOf       TimeOf
	// Keys selects records whose key equals one of these (bytes.Equal:
	// an empty or nil element matches an empty or nil key); none: any.
	Keys [][]byte
	// ErrorContains selects records whose error message
	// (HeaderMessage) contains it; "": any.
	ErrorContains string

	// MaxReplays refuses records already replayed that many times
	// (HeaderReplayCount >= MaxReplays); 0 means DefaultMaxReplays.
	MaxReplays int
	// DryRun selects and validates, and writes nothing.
	DryRun bool
}

// A ReplayReport is what Replay selected and what it wrote.
type ReplayReport struct {
	// Scanned is the number of dead-letter records read.
	Scanned int
	// Records are the selected records, in the order they are (or would
	// be) produced.
	Records []ReplayRecord
	// Duplicates are selected dead letters left out because another one
	// of the same original record (the same topic, partition and
	// OriginOffset: dead-lettered twice, or replayed and dead-lettered
	// again) was kept: the one replayed most, then the last written.
	Duplicates []Position
	// Problems are the selected records that made Replay refuse to write
	// anything (empty unless Replay returned a *ReplayRefusedError).
	Problems []ReplayProblem
	// Written is the number of records written (0 under DryRun).
	Written int
	DryRun  bool
}

// A ReplayRecord is one selected dead letter.
type ReplayRecord struct {
	// From is the dead letter's position.
	From Position
	// FailedAt is the dead letter's timestamp.
	FailedAt time.Time
	Key      []byte
	Value    []byte
	// DeadLetter is its parsed headers.
	DeadLetter DeadLetter
	// Replay is the replay count the republished record carries: one
	// more than the highest DeadLetter.Replays among the dead letters of
	// the same original record that Replay read (selected or not: a
	// filter on the error, the time or the key does not lower it).
	Replay int
	// Written is where the record was written (Offset -1 when it was not:
	// a dry run, or a produce failure, then in Err).
	Written Position
	Err     error
}

// A ReplayProblem is a selected dead letter Replay refuses: Err wraps
// ErrNotDeadLetter, ErrUnknownTopic, ErrReplayLimit or ErrReplayTooLarge.
type ReplayProblem struct {
	At  Position
	Err error
}

// A ReplayRefusedError is returned when some selected records cannot be
// replayed; nothing was written. errors.Is matches each problem's sentinel.
type ReplayRefusedError struct {
	Problems []ReplayProblem
}

func (e *ReplayRefusedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kafka: replay refused, nothing written: %s cannot be replayed", deadLetters(len(e.Problems), "selected dead letter"))
	for i, p := range e.Problems {
		if i == 10 {
			fmt.Fprintf(&b, "; and %d more", len(e.Problems)-i)
			break
		}
		sep := "; "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&b, "%s%s: %v", sep, p.At, p.Err)
	}
	return b.String()
}

// Unwrap returns the problems' errors.
func (e *ReplayRefusedError) Unwrap() []error {
	out := make([]error, len(e.Problems))
	for i, p := range e.Problems {
		out[i] = p.Err
	}
	return out
}

// Replay republishes chosen dead letters written by this adapter to their
// original topic and partition. It is an operator's tool: nothing calls it
// automatically.
//
// It reads the dead-letter topic's chosen partitions and offset range to
// their end as it was when Replay started (committed records only: those of
// an aborted transaction, or of one not committed by the partition's end
// when Replay started, are left out and not counted in Scanned; a record in
// the range of a transaction committed past an EndOffset is read), selects the records that match
// opts, drops duplicates (see ReplayReport.Duplicates), and validates every
// selected record before writing any: a record in the range that passes the
// filters Replay can apply without its headers (dead-letter partition and
// offsets, key, failure time) and is not an adapter dead letter, an original
// topic or partition that does not exist, a record replayed MaxReplays times
// already (counting the dead letters of the same record read but not
// selected), a record larger than the client may produce: each is a problem, and Replay writes nothing and returns a
// *ReplayRefusedError listing them all. A filter that matches nothing gives
// ErrNothingToReplay.
//
// Each republished record has the dead letter's key and value, the failed
// record's own headers (without the __connect.errors.* ones and the previous
// replay headers), the replay headers (HeaderReplayCount ...), the
// timestamp of the replay, and goes to the original partition (where the
// key's other records are). The records of one original partition are
// produced in the order they were first produced (HeaderReplayOriginOffset),
// with franz-go's idempotent producer, all at once, waiting for every
// acknowledgement. franz-go fails a partition's later records after a failed
// one, so a failure leaves, per partition, a written prefix: the report's
// Records say which were written (Written) and which not (Err), and Replay
// returns an error wrapping ErrReplayIncomplete and the first produce error.
//
// A replayed record goes to every consumer group of its topic, not only the
// one that dead-lettered it. Replaying the same dead letters twice writes them
// twice (each carries the dead letter's position: a handler can tell).
//
// clientOpts are franz-go options: seed brokers, TLS, SASL, timeouts. Replay
// adds its own (direct consumption of the dead-letter topic, the manual
// partitioner, reading uncommitted: it leaves out aborted and open
// transactions itself, so a kgo.FetchIsolationLevel is overridden); a
// consumer group, kgo.ConsumeTopics, kgo.ConsumePartitions or
// kgo.ConsumeRegex (it consumes nothing else), kgo.DisableIdempotentWrite, kgo.TransactionalID or
// kgo.ManualFlushing (nothing would flush: the
// produce would wait past ctx) make it fail with ErrInvalidOption, as do bad
// opts and a nil client option: each refusal is a *keysched.OptionError
// naming the option ("ReplayOptions.StartOffset", "kgo.ConsumerGroup",
// "clientOpts[2]"; "clientOpts" for options franz-go refuses, its error
// in Err), matching keysched.ErrInvalidOption too. A record the broker refuses (a topic's
// max.message.bytes smaller than the client's kgo.ProducerBatchMaxBytes) is
// not caught before writing.
// Memory: the selected records. ctx bounds the whole run (reading too: a
// dead-letter partition whose records below its end were deleted while
// Replay read it is waited for until ctx ends). The report is returned with
// every error but an invalid option or a nil ctx. Replay is safe for
// concurrent use (each call has its own clients); two concurrent replays of
// the same dead letters write them twice.
//
// The replay count is the highest among the dead letters of the same record
// that Replay read: filters on the error, the time, the key or the original
// partition do not lower it, but an offset range (or dead-letter partitions)
// that leaves a record's later dead letters unread does: its older dead
// letter starts again from its own count.
func Replay(ctx context.Context, opts ReplayOptions, clientOpts ...kgo.Opt) (*ReplayReport, error) {
	if ctx == nil {
		return nil, ErrNilContext
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.MaxReplays == 0 {
		opts.MaxReplays = DefaultMaxReplays
	}
	for i, o := range clientOpts {
		if o == nil {
			return nil, refused(optcheck.Refuse("clientOpts["+strconv.Itoa(i)+"]", nil, "nil kgo.Opt"))
		}
	}
	cl, err := kgo.NewClient(append(slices.Clip(clientOpts), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		return nil, refusedClientOpts(err)
	}
	defer cl.Close()
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g != "" {
		return nil, refused(optcheck.Refuse("kgo.ConsumerGroup", strconv.Quote(g), "Replay reads the dead-letter topic without a group"))
	}
	if ts, _ := cl.OptValue(kgo.ConsumeTopics).([]string); len(ts) > 0 {
		return nil, refused(optcheck.Refuse("kgo.ConsumeTopics", fmt.Sprintf("%q", ts), "Replay reads the dead-letter topic itself and consumes nothing else"))
	}
	if ps, _ := cl.OptValue(kgo.ConsumePartitions).(map[string]map[int32]kgo.Offset); len(ps) > 0 {
		return nil, refused(optcheck.Refuse("kgo.ConsumePartitions", nil, "Replay reads the dead-letter topic itself and consumes nothing else"))
	}
	// Alone it consumes nothing, but franz-go refuses it with the reading
	// client's direct partitions: only once there were records to read.
	if v, _ := cl.OptValue(kgo.ConsumeRegex).(bool); v {
		return nil, refused(optcheck.Refuse("kgo.ConsumeRegex", nil, "Replay reads the dead-letter topic's partitions directly and consumes nothing else"))
	}
	if v, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); v {
		return nil, refused(optcheck.Refuse("kgo.DisableIdempotentWrite", nil, "Replay produces idempotently"))
	}
	if vs := cl.OptValues(kgo.TransactionalID); len(vs) == 2 && vs[1] == true {
		return nil, refused(optcheck.Refuse("kgo.TransactionalID", nil, "Replay does not produce in a transaction"))
	}
	if v, _ := cl.OptValue(kgo.ManualFlushing).(bool); v {
		return nil, refused(optcheck.Refuse("kgo.ManualFlushing", nil, "Replay's produce would wait for a flush nothing makes"))
	}
	rep := &ReplayReport{DryRun: opts.DryRun}

	topics, err := partitionsOf(ctx, cl)
	if err != nil {
		return rep, err
	}
	dlqParts, ok := topics[opts.DeadLetterTopic]
	if !ok {
		return rep, fmt.Errorf("%w: dead-letter topic %q", ErrUnknownTopic, opts.DeadLetterTopic)
	}
	// A partition named twice is read once (twice in one ListOffsets
	// request is the broker's INVALID_REQUEST).
	parts := slices.Compact(slices.Sorted(slices.Values(opts.DeadLetterPartitions)))
	if len(parts) == 0 {
		parts = make([]int32, dlqParts)
		for i := range parts {
			parts[i] = int32(i)
		}
	}
	for _, p := range parts {
		if p >= dlqParts {
			return rep, fmt.Errorf("%w: dead-letter topic %q has %d partitions, no partition %d", ErrUnknownTopic, opts.DeadLetterTopic, dlqParts, p)
		}
	}
	ranges, err := readRanges(ctx, cl, opts, parts)
	if err != nil {
		return rep, err
	}
	selected, problems, replays, err := scan(ctx, clientOpts, opts, ranges, rep)
	if err != nil {
		if oe := (*keysched.OptionError)(nil); errors.As(err, &oe) {
			return nil, err // franz-go refused the reading client's options
		}
		return rep, err
	}
	selected, rep.Duplicates = dedupe(selected)
	batchMax, _ := cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32)
	writeMax, _ := cl.OptValue(kgo.BrokerMaxWriteBytes).(int32)
	maxBuffered, _ := cl.OptValue(kgo.MaxBufferedBytes).(int64)
	for i := range selected {
		r := &selected[i]
		d := &r.DeadLetter
		if n, ok := topics[d.Topic]; !ok || d.Partition >= n {
			problems = append(problems, ReplayProblem{r.From, fmt.Errorf("%w: original %q/%d (the dead letter of %q/%d@%d)",
				ErrUnknownTopic, d.Topic, d.Partition, d.Topic, d.Partition, d.Offset)})
		}
		// The count of the record's latest dead letter read, selected
		// or not: a filter that leaves it out does not reset the count.
		done := max(d.Replays, replays[originOf(d)])
		r.Replay = done + 1
		if done >= opts.MaxReplays {
			problems = append(problems, ReplayProblem{r.From, fmt.Errorf("%w: %q/%d@%d was replayed %d times already (limit %d)",
				ErrReplayLimit, d.Topic, d.Partition, d.Offset, done, opts.MaxReplays)})
		}
		// franz-go fails a record too large for a batch alone, at once,
		// and writes the partition's later ones: refuse it before
		// writing anything. The bound is the record's largest encoding
		// in a batch of its own (61 bytes of batch header, at most 36
		// of record framing and 10 per header).
		size := int64(len(r.Key) + len(r.Value))
		hs := d.replayHeaders(r.From, r.Replay)
		for _, h := range hs {
			size += int64(len(h.Key) + len(h.Value))
		}
		maxBytes := int64(writeMax) - 100 - int64(len(d.Topic)) // a produce request's framing around one batch
		if batchMax != nil {
			maxBytes = min(maxBytes, int64(batchMax(d.Topic)))
		}
		if size+61+36+10*int64(len(hs)) > maxBytes || maxBuffered > 0 && size > maxBuffered {
			problems = append(problems, ReplayProblem{r.From, fmt.Errorf("%w: %q/%d@%d would be a record of %d bytes (up to %d on the wire), the client produces at most %d (kgo.ProducerBatchMaxBytes)",
				ErrReplayTooLarge, d.Topic, d.Partition, d.Offset, size, size+61+36+10*int64(len(hs)), maxBytes)})
		}
	}
	// Produce order: per original partition, first-produced order.
	slices.SortStableFunc(selected, func(a, b ReplayRecord) int {
		return cmp.Or(strings.Compare(a.DeadLetter.Topic, b.DeadLetter.Topic),
			cmp.Compare(a.DeadLetter.Partition, b.DeadLetter.Partition),
			cmp.Compare(a.DeadLetter.OriginOffset, b.DeadLetter.OriginOffset))
	})
	rep.Records = selected
	if len(problems) > 0 {
		slices.SortStableFunc(problems, func(a, b ReplayProblem) int {
			return cmp.Or(cmp.Compare(a.At.Partition, b.At.Partition), cmp.Compare(a.At.Offset, b.At.Offset))
		})
		rep.Problems = problems
		return rep, &ReplayRefusedError{Problems: problems}
	}
	if len(selected) == 0 {
		if len(ranges) == 0 {
			return rep, fmt.Errorf("%w: %s has no records to read in %s", ErrNothingToReplay, opts.DeadLetterTopic, describeEmpty(parts, opts))
		}
		return rep, fmt.Errorf("%w: %s read in %s (%s), none selected by the filters",
			ErrNothingToReplay, deadLetters(rep.Scanned, "dead letter"), opts.DeadLetterTopic, describeRanges(ranges))
	}
	if opts.DryRun {
		return rep, nil
	}
	return rep, produceReplays(ctx, cl, rep)
}

func (o *ReplayOptions) validate() error {
	refuse := func(field string, value any, format string, args ...any) error {
		return refused(optcheck.Refuse("ReplayOptions."+field, value, format, args...))
	}
	switch {
	case o.DeadLetterTopic == "":
		return refuse("DeadLetterTopic", nil, "empty: need the topic to read")
	case o.StartOffset < 0:
		return refuse("StartOffset", o.StartOffset, "negative")
	case o.EndOffset < 0:
		return refuse("EndOffset", o.EndOffset, "negative")
	case o.EndOffset != 0 && o.EndOffset <= o.StartOffset:
		return refuse("EndOffset", o.EndOffset, "not above StartOffset %d: an empty offset range", o.StartOffset)
	case !o.Since.IsZero() && !o.Until.IsZero() && !o.Since.Before(o.Until):
		return refuse("Until", o.Until.Format(time.RFC3339Nano), "not after Since %s: an empty time range", o.Since.Format(time.RFC3339Nano))
	case o.TimeOf != RecordTime && o.TimeOf != FailureTime:
		return refuse("TimeOf", int(o.TimeOf), "need RecordTime or FailureTime")
	case o.MaxReplays < 0:
		return refuse("MaxReplays", o.MaxReplays, "negative")
	}
	for _, p := range o.DeadLetterPartitions {
		if p < 0 {
			return refuse("DeadLetterPartitions", p, "negative partition")
		}
	}
	for _, p := range o.Partitions {
		if p < 0 {
			return refuse("Partitions", p, "negative partition")
		}
	}
	for _, t := range o.Topics {
		if t == "" {
			return refuse("Topics", nil, "an empty topic name")
		}
	}
	return nil
}

// refusedClientOpts is the *keysched.OptionError of Replay's client
// options that franz-go refuses (err: franz-go's, in its Err).
func refusedClientOpts(err error) error {
	return &keysched.OptionError{Option: "clientOpts", Reason: "franz-go refuses them", Err: err, Sentinel: ErrInvalidOption}
}

// partitionsOf returns every topic's partition count.
func partitionsOf(ctx context.Context, cl *kgo.Client) (map[string]int32, error) {
	req := kmsg.NewPtrMetadataRequest() // Topics nil: all topics
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("kafka: replay: metadata: %w", err)
	}
	out := make(map[string]int32, len(resp.Topics))
	for _, t := range resp.Topics {
		if t.Topic == nil {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			if errors.Is(err, kerr.UnknownTopicOrPartition) {
				continue
			}
			return nil, fmt.Errorf("kafka: replay: metadata of %q: %w", *t.Topic, err)
		}
		out[*t.Topic] = int32(len(t.Partitions))
	}
	return out, nil
}

// offsetRange is what Replay reads of one dead-letter partition: [start,
// end), and the partition's end (high watermark) when Replay started, up to
// which it reads the markers of transactions still open at end.
type offsetRange struct {
	partition  int32
	start, end int64
	hwm        int64
}

func describeRanges(rs []offsetRange) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("partition %d offsets [%d, %d)", r.partition, r.start, r.end)
	}
	return strings.Join(parts, ", ")
}

// describeEmpty says what Replay read of parts, all empty in opts's range:
// "partition 0", "partitions 0, 1 at offsets [5, end)".
func describeEmpty(parts []int32, opts ReplayOptions) string {
	ps := make([]string, len(parts))
	for i, p := range parts {
		ps[i] = strconv.Itoa(int(p))
	}
	s := "partitions " + strings.Join(ps, ", ")
	if len(parts) == 1 {
		s = "partition " + ps[0]
	}
	if opts.StartOffset > 0 || opts.EndOffset > 0 {
		end := "end"
		if opts.EndOffset > 0 {
			end = strconv.FormatInt(opts.EndOffset, 10)
		}
		s += fmt.Sprintf(" at offsets [%d, %s)", opts.StartOffset, end)
	}
	return s
}

// deadLetters is n and noun, plural unless n is 1.
func deadLetters(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// readRanges lists the dead-letter partitions' start and end offsets and
// narrows them to opts's range; empty ranges are left out.
func readRanges(ctx context.Context, cl *kgo.Client, opts ReplayOptions, parts []int32) ([]offsetRange, error) {
	list := func(ts int64) (map[int32]int64, error) {
		req := kmsg.NewPtrListOffsetsRequest()
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = opts.DeadLetterTopic
		for _, p := range parts {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition, rp.Timestamp = p, ts
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
		shards := cl.RequestSharded(ctx, req)
		out := make(map[int32]int64, len(parts))
		for _, sh := range shards {
			if sh.Err != nil {
				return nil, fmt.Errorf("kafka: replay: list offsets of %q: %w", opts.DeadLetterTopic, sh.Err)
			}
			for _, t := range sh.Resp.(*kmsg.ListOffsetsResponse).Topics {
				for _, p := range t.Partitions {
					if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
						return nil, fmt.Errorf("kafka: replay: list offsets of %s/%d: %w", opts.DeadLetterTopic, p.Partition, err)
					}
					out[p.Partition] = p.Offset
				}
			}
		}
		for _, p := range parts {
			if _, ok := out[p]; !ok {
				return nil, fmt.Errorf("kafka: replay: list offsets of %s/%d: no answer", opts.DeadLetterTopic, p)
			}
		}
		return out, nil
	}
	starts, err := list(-2)
	if err != nil {
		return nil, err
	}
	ends, err := list(-1)
	if err != nil {
		return nil, err
	}
	var out []offsetRange
	for _, p := range parts {
		r := offsetRange{p, max(starts[p], opts.StartOffset), ends[p], ends[p]}
		if opts.EndOffset > 0 {
			r.end = min(r.end, opts.EndOffset)
		}
		if r.start < r.end {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b offsetRange) int { return cmp.Compare(a.partition, b.partition) })
	return out, nil
}

// origin is an original record: its topic, partition and offset as first
// produced.
type origin struct {
	topic     string
	partition int32
	offset    int64
}

func originOf(d *DeadLetter) origin { return origin{d.Topic, d.Partition, d.OriginOffset} }

// scan reads the ranges and returns the records that pass the filters, the
// problems found, and the highest replay count of every original record
// among the dead letters read (selected or not); it counts rep.Scanned.
// Records of aborted transactions, and of transactions not committed by the
// partition's end when Replay started, are left out (and not counted).
func scan(ctx context.Context, clientOpts []kgo.Opt, opts ReplayOptions, ranges []offsetRange, rep *ReplayReport) ([]ReplayRecord, []ReplayProblem, map[origin]int, error) {
	replays := map[origin]int{}
	if len(ranges) == 0 {
		return nil, nil, replays, nil
	}
	at := make(map[int32]kgo.Offset, len(ranges))
	left := make(map[int32]offsetRange, len(ranges)) // the partitions not read to their end
	for _, r := range ranges {
		at[r.partition] = kgo.NewOffset().At(r.start)
		left[r.partition] = r
	}
	cl, err := kgo.NewClient(append(slices.Clip(clientOpts),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{opts.DeadLetterTopic: at}),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), // records deleted meanwhile: go on from the log start
		kgo.KeepControlRecords(), // their offsets count towards the end
		// Every offset up to the end is read, whatever the caller's
		// options say: under ReadCommitted the read stopped at the last
		// stable offset, short of the end while a transaction was open,
		// and Replay waited until ctx ended. Transactions are filtered
		// here, from their markers.
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
	)...)
	if err != nil {
		return nil, nil, nil, refusedClientOpts(err)
	}
	defer cl.Close()
	var (
		selected []ReplayRecord
		problems []ReplayProblem
	)
	// Records of a transaction wait for its marker: an aborted one's, or
	// one still open at the partition's end when Replay started, are not
	// dead letters (the client reads uncommitted, to see every offset up
	// to the end). A transaction open at the range's end is read on to
	// its marker, up to that partition end.
	type txn struct {
		partition int32
		producer  int64
	}
	inTxn := map[txn][]*kgo.Record{}
	openIn := func(p int32) bool {
		for tk := range inTxn {
			if tk.partition == p {
				return true
			}
		}
		return false
	}
	take := func(r *kgo.Record) {
		rep.Scanned++
		if d, err := ParseDeadLetter(r.Headers); err == nil {
			o := originOf(&d)
			replays[o] = max(replays[o], d.Replays)
		}
		if rr, p, ok := selectRecord(opts, r); ok {
			if p != nil {
				problems = append(problems, *p)
			} else {
				selected = append(selected, rr)
			}
		}
	}
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, nil, nil, fmt.Errorf("kafka: replay: reading %q (%d partitions not read to their end): %w", opts.DeadLetterTopic, len(left), err)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if ferr == nil {
				ferr = fmt.Errorf("kafka: replay: reading %s/%d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return nil, nil, nil, ferr
		}
		for it := fs.RecordIter(); !it.Done(); {
			r := it.Next()
			pr, ok := left[r.Partition]
			if !ok {
				continue
			}
			tk := txn{r.Partition, r.ProducerID}
			switch {
			case r.Attrs.IsControl():
				// A transaction marker: its records count if it
				// commits (key: version, then type 1 commit, 0 abort).
				// Past the range, it ends a transaction open at the
				// range's end, whose records in the range count if it
				// commits (it had by the time Replay started if its
				// marker is before the partition's end then).
				recs := inTxn[tk]
				delete(inTxn, tk)
				if len(r.Key) >= 4 && binary.BigEndian.Uint16(r.Key[2:4]) == 1 {
					for _, r := range recs {
						take(r)
					}
				}
			case r.Offset >= pr.end:
				// Past the range: only markers count.
			case r.Attrs.IsTransactional():
				inTxn[tk] = append(inTxn[tk], r)
			default:
				take(r)
			}
			// The range is read once its last offset is (or a record
			// past it: a compacted topic's gap), and the markers of the
			// transactions open at its end, up to the partition's end
			// when Replay started (those still open there are not
			// committed).
			if r.Offset+1 >= pr.hwm || r.Offset+1 >= pr.end && !openIn(r.Partition) {
				delete(left, r.Partition)
				cl.PauseFetchPartitions(map[string][]int32{opts.DeadLetterTopic: {r.Partition}})
			}
		}
	}
	return selected, problems, replays, nil
}

// selectRecord applies opts's filters to the dead letter r: ok reports
// whether it is selected; p is set for a selected record that is not a dead
// letter.
func selectRecord(opts ReplayOptions, r *kgo.Record) (rr ReplayRecord, p *ReplayProblem, ok bool) {
	from := Position{r.Topic, r.Partition, r.Offset}
	if len(opts.Keys) > 0 && !slices.ContainsFunc(opts.Keys, func(k []byte) bool { return bytes.Equal(k, r.Key) }) {
		return rr, nil, false
	}
	if opts.TimeOf == FailureTime && !inTime(opts, r.Timestamp) {
		return rr, nil, false
	}
	d, err := ParseDeadLetter(r.Headers)
	if err != nil {
		return rr, &ReplayProblem{from, err}, true
	}
	if len(opts.Topics) > 0 && !slices.Contains(opts.Topics, d.Topic) ||
		len(opts.Partitions) > 0 && !slices.Contains(opts.Partitions, d.Partition) ||
		opts.TimeOf == RecordTime && !inTime(opts, d.Timestamp) ||
		!strings.Contains(d.Error, opts.ErrorContains) {
		return rr, nil, false
	}
	return ReplayRecord{From: from, FailedAt: r.Timestamp, Key: r.Key, DeadLetter: d, Replay: d.Replays + 1,
		Value: r.Value, Written: Position{d.Topic, d.Partition, -1}}, nil, true
}

func inTime(opts ReplayOptions, t time.Time) bool {
	return (opts.Since.IsZero() || !t.Before(opts.Since)) && (opts.Until.IsZero() || t.Before(opts.Until))
}

// dedupe keeps one dead letter per original record (topic, partition,
// origin offset): the one replayed most, then the last written (the highest
// failure time, then the highest position).
func dedupe(rs []ReplayRecord) (kept []ReplayRecord, dropped []Position) {
	best := make(map[origin]int, len(rs))
	later := func(a, b *ReplayRecord) bool { // a supersedes b
		if a.DeadLetter.Replays != b.DeadLetter.Replays {
			return a.DeadLetter.Replays > b.DeadLetter.Replays
		}
		if !a.FailedAt.Equal(b.FailedAt) {
			return a.FailedAt.After(b.FailedAt)
		}
		return cmp.Or(cmp.Compare(a.From.Partition, b.From.Partition), cmp.Compare(a.From.Offset, b.From.Offset)) > 0
	}
	for i := range rs {
		o := origin{rs[i].DeadLetter.Topic, rs[i].DeadLetter.Partition, rs[i].DeadLetter.OriginOffset}
		j, ok := best[o]
		if !ok || later(&rs[i], &rs[j]) {
			best[o] = i
		}
	}
	for i := range rs {
		o := origin{rs[i].DeadLetter.Topic, rs[i].DeadLetter.Partition, rs[i].DeadLetter.OriginOffset}
		if best[o] == i {
			kept = append(kept, rs[i])
		} else {
			dropped = append(dropped, rs[i].From)
		}
	}
	return kept, dropped
}

// produceReplays writes rep.Records, in order, and waits for every
// acknowledgement.
func produceReplays(ctx context.Context, cl *kgo.Client, rep *ReplayReport) error {
	recs := make([]*kgo.Record, len(rep.Records))
	for i := range rep.Records {
		r := &rep.Records[i]
		recs[i] = &kgo.Record{Topic: r.DeadLetter.Topic, Partition: r.DeadLetter.Partition, Key: r.Key, Value: r.Value,
			Headers: r.DeadLetter.replayHeaders(r.From, r.Replay)}
	}
	index := make(map[*kgo.Record]int, len(recs))
	for i, r := range recs {
		index[r] = i
	}
	res := cl.ProduceSync(ctx, recs...) // results in completion order
	var first error
	for _, pr := range res {
		r := &rep.Records[index[pr.Record]]
		if pr.Err != nil {
			r.Err = pr.Err
			first = cmp.Or(first, pr.Err)
			continue
		}
		r.Written.Offset = pr.Record.Offset
		rep.Written++
	}
	if first != nil {
		return fmt.Errorf("%w: %d of %d records written (see the report): %w", ErrReplayIncomplete, rep.Written, len(rep.Records), first)
	}
	return nil
}
