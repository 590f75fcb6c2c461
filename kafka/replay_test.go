package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// deadLetterRec is a dead letter for the test producer: d encoded as the
// adapter writes it, into dlq's partition part.
func deadLetterRec(dlq string, part int32, key, value string, failedAt time.Time, d DeadLetter) *kgo.Record {
	r := rec(dlq, part, key, value)
	r.Timestamp = failedAt
	r.Headers = d.headers()
	return r
}

// dl is a dead letter of topic/partition@offset failed with msg.
func dl(topic string, part int32, off int64, msg string) DeadLetter {
	return DeadLetter{Topic: topic, Partition: part, Offset: off, OriginOffset: off, Timestamp: time.UnixMilli(1e12 + off),
		Group: "g", Attempts: 3, ErrorClass: "*errors.errorString", Error: msg}
}

func replayOpts(tc *testCluster) []kgo.Opt {
	return []kgo.Opt{kgo.SeedBrokers(tc.addrs...), kgo.FetchMaxWait(50 * time.Millisecond)}
}

func replay(t *testing.T, tc *testCluster, o ReplayOptions) (*ReplayReport, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return Replay(ctx, o, replayOpts(tc)...)
}

func froms(rs []ReplayRecord) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.From.String())
	}
	return out
}

// The whole loop with the real consumer: records dead-lettered by the
// adapter are replayed once fixed, with their key, value and own headers,
// without the error headers, with the replay headers; a record that fails
// again is dead-lettered again with its replay count; past MaxReplays,
// Replay refuses it. The encoder the other tests use writes exactly the
// adapter's headers.
func TestReplayThroughTheConsumer(t *testing.T) {
	tc := newCluster(t, 2, "t", "dlq")
	var rs []*kgo.Record
	for _, kv := range [][2]string{{"a", "fixme-1"}, {"b", "fail-1"}, {"a", "fixme-2"}} {
		r := rec("t", 0, kv[0], kv[1])
		r.Headers = []kgo.RecordHeader{{Key: "trace", Value: []byte("x-" + kv[1])}}
		rs = append(rs, r)
	}
	tc.produce(t, rs...)
	var (
		mu    sync.Mutex
		fixed bool
		seen  []*kgo.Record // handled with success
	)
	h := func(_ context.Context, r *kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		v := string(r.Value)
		if strings.HasPrefix(v, "fail") || strings.HasPrefix(v, "fixme") && !fixed {
			return fmt.Errorf("cannot handle %s", v)
		}
		seen = append(seen, r)
		return nil
	}
	startConsumer(t, h, WithLogger(quiet), WithDeadLetterTopic("dlq"), WithCommitInterval(5*time.Millisecond),
		WithSchedulerOptions(keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 1})),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	dlqEnd := func() int64 { return tc.endOffset(t, "dlq", 0) + tc.endOffset(t, "dlq", 1) }
	eventually(t, "3 dead letters", func() bool { return dlqEnd() == 3 })
	for _, r := range tc.readAll(t, "dlq", 3) {
		d, err := ParseDeadLetter(r.Headers)
		if err != nil {
			t.Fatalf("the adapter's dead letter %v: %v", r.Headers, err)
		}
		if got := d.headers(); !slices.EqualFunc(got, r.Headers, func(a, b kgo.RecordHeader) bool {
			return a.Key == b.Key && string(a.Value) == string(b.Value)
		}) {
			t.Errorf("encoder: %v\nadapter: %v", got, r.Headers)
		}
		if d.Attempts != 1 || d.Group == "" || d.Replays != 0 || len(d.Headers) != 1 || d.Headers[0].Key != "trace" {
			t.Errorf("parsed %+v", d)
		}
	}

	mu.Lock()
	fixed = true
	mu.Unlock()
	rep, err := replay(t, tc, ReplayOptions{DeadLetterTopic: "dlq", Topics: []string{"t"}, ErrorContains: "fixme"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Written != 2 || len(rep.Records) != 2 || rep.Scanned != 3 {
		t.Fatalf("report %+v", rep)
	}
	eventually(t, "the 2 replayed records handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) == 2 })
	mu.Lock()
	for i, r := range seen {
		want := fmt.Sprintf("fixme-%d", i+1)
		if string(r.Key) != "a" || string(r.Value) != want {
			t.Errorf("replayed record %d: key %q value %q, want a %q (in their original order)", i, r.Key, r.Value, want)
		}
		if v, _ := header(r, "trace"); v != "x-"+want {
			t.Errorf("replayed record %d lost its own header: %v", i, r.Headers)
		}
		if v, _ := header(r, HeaderReplayCount); v != "1" {
			t.Errorf("replayed record %d: replay count %q", i, v)
		}
		from := rep.Records[i].From
		dt, _ := header(r, HeaderReplayDeadLetterTopic)
		dp, _ := header(r, HeaderReplayDeadLetterPartition)
		do, _ := header(r, HeaderReplayDeadLetterOffset)
		if dt != "dlq" || dp != fmt.Sprint(from.Partition) || do != fmt.Sprint(from.Offset) {
			t.Errorf("replayed record %d: came from %s/%s@%s, report says %s", i, dt, dp, do, from)
		}
		for _, h := range r.Headers {
			if strings.HasPrefix(h.Key, "__connect.errors.") {
				t.Errorf("replayed record %d kept the error header %s", i, h.Key)
			}
		}
		if rep.Records[i].Written != (Position{"t", 0, r.Offset}) {
			t.Errorf("report says written at %v, the consumer saw t/0@%d", rep.Records[i].Written, r.Offset)
		}
	}
	mu.Unlock()

	// b fails again each time: dead-lettered again with its count, until
	// the limit.
	for round := 1; round <= 2; round++ {
		rep, err := replay(t, tc, ReplayOptions{DeadLetterTopic: "dlq", Keys: [][]byte{[]byte("b")}, MaxReplays: 2})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if rep.Written != 1 || rep.Records[0].Replay != round || len(rep.Duplicates) != round-1 {
			t.Fatalf("round %d: report %+v", round, rep)
		}
		eventually(t, "b dead-lettered again", func() bool { return dlqEnd() == int64(3+round) })
	}
	var counts []int
	for _, r := range tc.readAll(t, "dlq", 5) {
		if string(r.Key) == "b" {
			d, err := ParseDeadLetter(r.Headers)
			if err != nil {
				t.Fatal(err)
			}
			counts = append(counts, d.Replays)
			if d.OriginOffset != 1 {
				t.Errorf("b's dead letter: origin offset %d, want 1", d.OriginOffset)
			}
		}
	}
	if !slices.Equal(counts, []int{0, 1, 2}) {
		t.Errorf("b's dead letters carry replay counts %v, want [0 1 2]", counts)
	}
	end := tc.endOffset(t, "t", 0)
	rep, err = replay(t, tc, ReplayOptions{DeadLetterTopic: "dlq", Keys: [][]byte{[]byte("b")}, MaxReplays: 2})
	var refused *ReplayRefusedError
	if !errors.Is(err, ErrReplayLimit) || !errors.As(err, &refused) || len(refused.Problems) != 1 || rep.Written != 0 {
		t.Fatalf("past the limit: %v, report %+v", err, rep)
	}
	if n := tc.endOffset(t, "t", 0); n != end {
		t.Errorf("refused replay wrote %d records", n-end)
	}
}

// Replayed records of one original partition are produced in the order
// their originals were first produced, wherever their dead letters are
// (two dead-letter partitions, a record replayed and dead-lettered again).
func TestReplayKeepsOriginalOrder(t *testing.T) {
	tc := newCluster(t, 2, "t", "dlq")
	at := time.Now()
	replayed := dl("t", 0, 100, "again") // the replay of offset 3, failed again
	replayed.Replays, replayed.OriginOffset, replayed.ReplayedFrom = 1, 3, Position{"dlq", 1, 0}
	tc.produce(t,
		deadLetterRec("dlq", 0, "k", "7", at, dl("t", 0, 7, "x")),
		deadLetterRec("dlq", 1, "k", "5", at, dl("t", 0, 5, "x")),
		deadLetterRec("dlq", 0, "k", "3", at, replayed),
		deadLetterRec("dlq", 1, "j", "6", at, dl("t", 0, 6, "x")),
		deadLetterRec("dlq", 1, "k", "9", at, dl("t", 0, 9, "x")),
		deadLetterRec("dlq", 0, "j", "4", at, dl("t", 0, 4, "x")),
	)
	rep, err := replay(t, tc, ReplayOptions{DeadLetterTopic: "dlq"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range tc.readAll(t, "t", 6) {
		got = append(got, string(r.Value))
	}
	if want := []string{"3", "4", "5", "6", "7", "9"}; !slices.Equal(got, want) {
		t.Errorf("t/0 got %v, want %v (first-produced order)", got, want)
	}
	for i, r := range rep.Records {
		if r.Written.Offset != int64(i) {
			t.Errorf("report: record %d (%s) written at %v", i, r.From, r.Written)
		}
	}
}

// Each filter selects what it says, and they combine.
func TestReplayFilters(t *testing.T) {
	tc := newCluster(t, 2, "t", "u", "dlq")
	t0 := time.UnixMilli(5e12)
	mk := func(topic string, part int32, off int64, key, msg string, i int) *kgo.Record {
		d := dl(topic, part, off, msg)
		d.Timestamp = time.UnixMilli(1e12 + int64(i)*1000)
		return deadLetterRec("dlq", 0, key, "v", t0.Add(time.Duration(i)*time.Second), d)
	}
	tc.produce(t,
		mk("t", 0, 10, "a", "timeout calling billing", 0),
		mk("t", 1, 11, "b", "boom", 1),
		mk("u", 0, 12, "a", "timeout", 2),
		mk("t", 0, 13, "c", "boom", 3),
	)
	rt := func(i int) time.Time { return time.UnixMilli(1e12 + int64(i)*1000) }
	for _, c := range []struct {
		name string
		o    ReplayOptions
		want []int64 // dead-letter offsets
	}{
		{"all", ReplayOptions{}, []int64{0, 3, 1, 2}},                     // produce order: t/0, t/1, u/0
		{"topic", ReplayOptions{Topics: []string{"t"}}, []int64{0, 3, 1}}, // produce order: t/0, then t/1
		{"partition", ReplayOptions{Partitions: []int32{1}}, []int64{1}},
		{"topic and partition", ReplayOptions{Topics: []string{"t"}, Partitions: []int32{0}}, []int64{0, 3}},
		{"record time", ReplayOptions{Since: rt(1), Until: rt(3)}, []int64{1, 2}},
		{"record time since", ReplayOptions{Since: rt(2)}, []int64{3, 2}},
		{"failure time", ReplayOptions{TimeOf: FailureTime, Since: t0.Add(time.Second), Until: t0.Add(3 * time.Second)}, []int64{1, 2}},
		{"key", ReplayOptions{Keys: [][]byte{[]byte("a")}}, []int64{0, 2}},
		{"keys", ReplayOptions{Keys: [][]byte{[]byte("a"), []byte("c")}}, []int64{0, 3, 2}},
		{"error text", ReplayOptions{ErrorContains: "timeout"}, []int64{0, 2}},
		{"offsets", ReplayOptions{StartOffset: 1, EndOffset: 3}, []int64{1, 2}},
		{"combined", ReplayOptions{Topics: []string{"t"}, ErrorContains: "boom", Keys: [][]byte{[]byte("c"), []byte("b")}}, []int64{3, 1}},
	} {
		c.o.DeadLetterTopic, c.o.DryRun = "dlq", true
		rep, err := replay(t, tc, c.o)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		var got []int64
		for _, r := range rep.Records {
			got = append(got, r.From.Offset)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: selected %v, want %v", c.name, got, c.want)
		}
	}
	if n := tc.endOffset(t, "t", 0) + tc.endOffset(t, "t", 1) + tc.endOffset(t, "u", 0); n != 0 {
		t.Errorf("dry runs wrote %d records", n)
	}
}

// Bad input is refused before anything is written, with an error that says
// what and where.
func TestReplayRefusesBadInputAndWritesNothing(t *testing.T) {
	tc := newCluster(t, 2, "t", "dlq", "mixed", "gone-dlq", "over")
	at := time.Now()
	notDL := rec("mixed", 0, "z", "not a dead letter")
	notDL.Headers = []kgo.RecordHeader{{Key: HeaderTopic, Value: []byte("t")}}
	tc.produce(t,
		deadLetterRec("mixed", 0, "a", "1", at, dl("t", 0, 1, "x")),
		notDL,
		deadLetterRec("mixed", 0, "a", "2", at, dl("t", 0, 2, "x")),
		deadLetterRec("gone-dlq", 0, "a", "1", at, dl("t", 0, 1, "x")),
		deadLetterRec("gone-dlq", 0, "a", "2", at, dl("gone", 0, 2, "x")),
		deadLetterRec("gone-dlq", 0, "a", "3", at, dl("t", 7, 3, "x")),
		deadLetterRec("over", 0, "a", "1", at, dl("t", 0, 1, "x")),
	)
	over := dl("t", 0, 2, "x")
	over.Replays, over.ReplayedFrom = DefaultMaxReplays, Position{"over", 0, 0}
	tc.produce(t, deadLetterRec("over", 0, "a", "2", at, over))

	check := func(name string, o ReplayOptions, sentinel error, problems []string) {
		t.Helper()
		rep, err := replay(t, tc, o)
		if !errors.Is(err, sentinel) {
			t.Errorf("%s: %v, want %v", name, err, sentinel)
			return
		}
		if rep == nil || rep.Written != 0 {
			t.Errorf("%s: report %+v", name, rep)
		}
		var refused *ReplayRefusedError
		if problems == nil {
			return
		}
		if !errors.As(err, &refused) {
			t.Errorf("%s: %T, want a *ReplayRefusedError", name, err)
			return
		}
		var got []string
		for _, p := range refused.Problems {
			got = append(got, p.At.String())
			if !strings.Contains(err.Error(), p.At.String()) {
				t.Errorf("%s: the message %q does not name %s", name, err, p.At)
			}
		}
		if !slices.Equal(got, problems) {
			t.Errorf("%s: problems at %v, want %v", name, got, problems)
		}
	}
	check("unknown dead-letter topic", ReplayOptions{DeadLetterTopic: "nope"}, ErrUnknownTopic, nil)
	check("unknown dead-letter partition", ReplayOptions{DeadLetterTopic: "dlq", DeadLetterPartitions: []int32{2}}, ErrUnknownTopic, nil)
	check("empty dead-letter topic", ReplayOptions{DeadLetterTopic: "dlq"}, ErrNothingToReplay, nil)
	check("not a dead letter", ReplayOptions{DeadLetterTopic: "mixed"}, ErrNotDeadLetter, []string{"mixed/0@1"})
	check("unknown original topic or partition", ReplayOptions{DeadLetterTopic: "gone-dlq"}, ErrUnknownTopic, []string{"gone-dlq/0@1", "gone-dlq/0@2"})
	check("past the replay limit", ReplayOptions{DeadLetterTopic: "over"}, ErrReplayLimit, []string{"over/0@1"})
	check("past the replay limit, dry run", ReplayOptions{DeadLetterTopic: "over", DryRun: true}, ErrReplayLimit, []string{"over/0@1"})
	check("nothing matches", ReplayOptions{DeadLetterTopic: "mixed", ErrorContains: "nope", Keys: [][]byte{[]byte("a")}}, ErrNothingToReplay, nil)
	check("offset range past the end", ReplayOptions{DeadLetterTopic: "mixed", StartOffset: 3}, ErrNothingToReplay, nil)
	if n := tc.endOffset(t, "t", 0) + tc.endOffset(t, "t", 1); n != 0 {
		t.Errorf("refused replays wrote %d records", n)
	}
	// A filter that leaves the foreign record out lets the rest through.
	rep, err := replay(t, tc, ReplayOptions{DeadLetterTopic: "mixed", Keys: [][]byte{[]byte("a")}})
	if err != nil || rep.Written != 2 {
		t.Errorf("mixed, key a: %v, report %+v", err, rep)
	}

	for _, c := range []struct {
		name string
		o    ReplayOptions
		opts []kgo.Opt
	}{
		{"no topic", ReplayOptions{}, nil},
		{"empty offset range", ReplayOptions{DeadLetterTopic: "dlq", StartOffset: 5, EndOffset: 5}, nil},
		{"negative offset", ReplayOptions{DeadLetterTopic: "dlq", StartOffset: -1}, nil},
		{"empty time range", ReplayOptions{DeadLetterTopic: "dlq", Since: at, Until: at}, nil},
		{"negative partition", ReplayOptions{DeadLetterTopic: "dlq", Partitions: []int32{-1}}, nil},
		{"negative limit", ReplayOptions{DeadLetterTopic: "dlq", MaxReplays: -1}, nil},
		{"bad TimeOf", ReplayOptions{DeadLetterTopic: "dlq", TimeOf: 7}, nil},
		{"not idempotent", ReplayOptions{DeadLetterTopic: "dlq"}, []kgo.Opt{kgo.DisableIdempotentWrite()}},
		{"transactional", ReplayOptions{DeadLetterTopic: "dlq"}, []kgo.Opt{kgo.TransactionalID("x")}},
		{"group", ReplayOptions{DeadLetterTopic: "dlq"}, []kgo.Opt{kgo.ConsumerGroup("g")}},
		// Found by attacking the code: with kgo.ManualFlushing the
		// produce waited for a Flush nothing made, past ctx, forever.
		{"manual flushing", ReplayOptions{DeadLetterTopic: "dlq"}, []kgo.Opt{kgo.ManualFlushing()}},
	} {
		_, err := Replay(context.Background(), c.o, append(replayOpts(tc), c.opts...)...)
		if !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", c.name, err)
		}
	}
}

// Found by attacking the code: a record replayed MaxReplays times and dead-
// lettered again was replayed once more (with count 1) by a filter that
// selected its first dead letter only (--error matching the first failure's
// message, not the last one's): the limit was read from the selected dead
// letter alone. The count is now the highest among the record's dead letters
// read, selected or not.
func TestReplayLimitCountsDeadLettersTheFiltersLeaveOut(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	at := time.Now()
	last := func(off int64, replays int, msg string) DeadLetter {
		d := dl("t", 0, 100+off, msg)
		d.Replays, d.OriginOffset, d.ReplayedFrom = replays, off, Position{"dlq", 0, 0}
		return d
	}
	tc.produce(t,
		deadLetterRec("dlq", 0, "a", "a", at, dl("t", 0, 1, "timeout")),
		deadLetterRec("dlq", 0, "b", "b", at, dl("t", 0, 2, "timeout")),
		deadLetterRec("dlq", 0, "a", "a", at, last(1, DefaultMaxReplays, "bad payload")),
		deadLetterRec("dlq", 0, "b", "b", at, last(2, 1, "bad payload")),
	)
	_, err := replay(t, tc, ReplayOptions{DeadLetterTopic: "dlq", ErrorContains: "timeout"})
	var refused *ReplayRefusedError
	if !errors.Is(err, ErrReplayLimit) || !errors.As(err, &refused) || len(refused.Problems) != 1 || refused.Problems[0].At.String() != "dlq/0@0" {
		t.Fatalf("err %v, want ErrReplayLimit for dlq/0@0 only", err)
	}
	if n := tc.endOffset(t, "t", 0); n != 0 {
		t.Fatalf("wrote %d records", n)
	}
	rep, err := replay(t, tc, ReplayOptions{DeadLetterTopic: "dlq", ErrorContains: "timeout", Keys: [][]byte{[]byte("b")}})
	if err != nil {
		t.Fatal(err)
	}
	if got := froms(rep.Records); !slices.Equal(got, []string{"dlq/0@1"}) || rep.Records[0].Replay != 2 {
		t.Fatalf("replayed %v (count %d), want dlq/0@1 as replay 2 (its later dead letter was replay 1)", got, rep.Records[0].Replay)
	}
	got := tc.readAll(t, "t", 1)[0]
	for _, h := range got.Headers {
		if h.Key == HeaderReplayCount && string(h.Value) != "2" {
			t.Errorf("%s %q, want 2", HeaderReplayCount, h.Value)
		}
	}
}

// Found by attacking the code: a dead letter too large for the client to
// produce (written to the dead-letter topic by a producer allowing larger
// batches) failed alone at once in franz-go, and the key's later record of
// the same partition was written: the replay broke the key's order and the
// "written prefix" the doc promises. It is now refused before anything is
// written.
func TestReplayRefusesRecordsTooLargeToProduce(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	at := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tc.addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(4<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(),
		deadLetterRec("dlq", 0, "a", strings.Repeat("x", 2<<20), at, dl("t", 0, 1, "x")),
		deadLetterRec("dlq", 0, "a", "small", at, dl("t", 0, 2, "x")),
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	rep, err := replay(t, tc, ReplayOptions{DeadLetterTopic: "dlq"})
	var refused *ReplayRefusedError
	if !errors.Is(err, ErrReplayTooLarge) || !errors.As(err, &refused) || len(refused.Problems) != 1 || refused.Problems[0].At.String() != "dlq/0@0" {
		t.Fatalf("err %v, want ErrReplayTooLarge for dlq/0@0", err)
	}
	if rep.Written != 0 || tc.endOffset(t, "t", 0) != 0 {
		t.Fatalf("wrote %d records (report: %d)", tc.endOffset(t, "t", 0), rep.Written)
	}
	// The client that allows it writes both, in order.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rep, err = Replay(ctx, ReplayOptions{DeadLetterTopic: "dlq"}, append(replayOpts(tc), kgo.ProducerBatchMaxBytes(4<<20))...)
	if err != nil || rep.Written != 2 {
		t.Fatalf("with a larger batch: %v, report %+v", err, rep)
	}
}

// Found by attacking the code: a dead-letter topic written (also) by a
// transactional producer held aborted records and records of a transaction
// still open; Replay read uncommitted and replayed both, records that were
// never dead-lettered. Only committed records (and non-transactional ones)
// are read now.
func TestReplayReadsOnlyCommittedDeadLetters(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	at := time.Now()
	inTxn := tc.inTxn(t)
	inTxn(txnAbort, deadLetterRec("dlq", 0, "a", "aborted", at, dl("t", 0, 1, "x")))
	tc.produce(t, deadLetterRec("dlq", 0, "a", "plain", at, dl("t", 0, 2, "x")))
	inTxn(txnCommit, deadLetterRec("dlq", 0, "a", "committed", at, dl("t", 0, 3, "x")))
	inTxn(txnOpen, deadLetterRec("dlq", 0, "a", "open", at, dl("t", 0, 4, "x"))) // left open
	rep, err := replay(t, tc, ReplayOptions{DeadLetterTopic: "dlq", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rep.Records {
		got = append(got, string(r.Value))
	}
	if !slices.Equal(got, []string{"plain", "committed"}) || rep.Scanned != 2 {
		t.Errorf("selected %v (scanned %d), want plain and committed (scanned 2)", got, rep.Scanned)
	}
}

// Found by attacking the code: a dead-letter partition named twice
// (--dlq-partition 1,0,1) was sent twice in one ListOffsets request, and the
// broker's INVALID_REQUEST ended the replay. It is read once.
func TestReplayReadsADeadLetterPartitionNamedTwiceOnce(t *testing.T) {
	tc := newCluster(t, 2, "t", "dlq")
	at := time.Now()
	tc.produce(t, deadLetterRec("dlq", 0, "a", "a0", at, dl("t", 0, 1, "x")), deadLetterRec("dlq", 1, "a", "a1", at, dl("t", 0, 2, "x")))
	rep, err := replay(t, tc, ReplayOptions{DeadLetterTopic: "dlq", DryRun: true, DeadLetterPartitions: []int32{1, 0, 1}})
	if err != nil {
		t.Fatal(err)
	}
	if got := froms(rep.Records); !slices.Equal(got, []string{"dlq/0@0", "dlq/1@0"}) || rep.Scanned != 2 {
		t.Errorf("selected %v (scanned %d), want dlq/0@0 and dlq/1@0 once each", got, rep.Scanned)
	}
}

// The same original record dead-lettered twice is replayed once: the dead
// letter replayed most, then the last written.
func TestReplayDropsDuplicateDeadLetters(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	at := time.Now()
	again := dl("t", 0, 50, "x")
	again.Replays, again.OriginOffset, again.ReplayedFrom = 1, 1, Position{"dlq", 0, 0}
	tc.produce(t,
		deadLetterRec("dlq", 0, "a", "first", at, dl("t", 0, 1, "x")),
		deadLetterRec("dlq", 0, "a", "twice", at, dl("t", 0, 1, "x")), // the same failure written twice
		deadLetterRec("dlq", 0, "a", "again", at, again),
		deadLetterRec("dlq", 0, "b", "other", at, dl("t", 0, 2, "x")),
	)
	rep, err := replay(t, tc, ReplayOptions{DeadLetterTopic: "dlq", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := froms(rep.Records); !slices.Equal(got, []string{"dlq/0@2", "dlq/0@3"}) {
		t.Errorf("kept %v, want dlq/0@2 (replayed once) and dlq/0@3", got)
	}
	if len(rep.Duplicates) != 2 {
		t.Errorf("duplicates %v", rep.Duplicates)
	}
	if rep.Records[0].Replay != 2 {
		t.Errorf("replay count %d, want 2", rep.Records[0].Replay)
	}
}

// The produce is idempotent (the client asks for a producer ID) and waits
// for the acknowledgements: a partition whose produce fails is reported
// record by record, the others are written and reported.
func TestReplayReportsWhatItWrote(t *testing.T) {
	tc := newCluster(t, 2, "t", "dlq")
	at := time.Now()
	tc.produce(t,
		deadLetterRec("dlq", 0, "a", "a0", at, dl("t", 0, 1, "x")),
		deadLetterRec("dlq", 0, "b", "b0", at, dl("t", 1, 1, "x")),
		deadLetterRec("dlq", 0, "a", "a1", at, dl("t", 0, 2, "x")),
		deadLetterRec("dlq", 0, "b", "b1", at, dl("t", 1, 2, "x")),
	)
	initPID := tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.InitProducerID}, Observe: true, Count: -1})
	defer initPID.Remove()
	fail := tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "t", Partitions: []int32{1}, Err: kerr.InvalidRecord, Count: -1})
	rep, err := replay(t, tc, ReplayOptions{DeadLetterTopic: "dlq"})
	fail.Remove()
	if !errors.Is(err, ErrReplayIncomplete) || !errors.Is(err, kerr.InvalidRecord) {
		t.Fatalf("err %v, want ErrReplayIncomplete wrapping INVALID_RECORD", err)
	}
	if rep.Written != 2 {
		t.Errorf("written %d, want 2", rep.Written)
	}
	for _, r := range rep.Records {
		ok := r.Err == nil && r.Written.Offset >= 0
		if want := r.DeadLetter.Partition == 0; ok != want {
			t.Errorf("%s -> %v: err %v, want written %v", r.From, r.Written, r.Err, want)
		}
	}
	if n := tc.endOffset(t, "t", 0); n != 2 {
		t.Errorf("t/0 has %d records, want 2", n)
	}
	if n := tc.endOffset(t, "t", 1); n != 0 {
		t.Errorf("t/1 has %d records, want 0", n)
	}
	if initPID.Hits() == 0 {
		t.Error("no InitProducerID: the replay produce is not idempotent")
	}
}
