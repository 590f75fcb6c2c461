package main

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/keysched/keysched/internal/trace"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The handler's checks read the key id and position from the record's
// value: a record handled before an earlier one of its key has finished is
// an order violation, one handled twice a duplicate, and the run ends when
// every event was handled once.
func TestTallyCountsOrderViolationsAndDuplicates(t *testing.T) {
	s := newStream([]trace.Event{{Key: "a"}, {Key: "a"}, {Key: "a"}, {Key: "b"}})
	ty := newTally(s, workSpec{kind: "none"}, false)
	rec := func(seq int) *kgo.Record { return &kgo.Record{Value: encodeValue(seq, s.ids[seq], s.ord[seq])} }
	for _, seq := range []int{0, 2, 1, 1, 3} { // a's third before its second; a's second twice
		if err := ty.handle(context.Background(), rec(seq)); err != nil {
			t.Fatal(err)
		}
	}
	if v, d := ty.violations.Load(), ty.dups.Load(); v != 1 || d != 1 {
		t.Fatalf("%d order violations, %d duplicates; want 1 and 1", v, d)
	}
	if n := ty.count(); n != 4 {
		t.Fatalf("counted %d events handled, want 4", n)
	}
	select {
	case <-ty.all:
	default:
		t.Fatal("every event handled, but the run is not over")
	}
}

// A record that is not the benchmark's (another length, a position or key
// id outside the stream) is ignored, not counted and no panic.
func TestTallyIgnoresForeignRecords(t *testing.T) {
	s := newStream([]trace.Event{{Key: "a"}, {Key: "b"}})
	ty := newTally(s, workSpec{kind: "none"}, false)
	foreign := [][]byte{
		nil,
		binary.BigEndian.AppendUint64(nil, 0), // the old 8-byte value
		encodeValue(2, 0, 0),                  // position past the stream
		encodeValue(0, 7, 0),                  // key id past the stream's keys
		encodeValue(0, -1, 0),
	}
	for _, v := range foreign {
		ty.OnFetchRecordUnbuffered(&kgo.Record{Value: v}, true)
		if err := ty.handle(context.Background(), &kgo.Record{Value: v}); err != nil {
			t.Fatal(err)
		}
	}
	if n, v, d := ty.count(), ty.violations.Load(), ty.dups.Load(); n != 0 || v != 0 || d != 0 {
		t.Fatalf("foreign records counted: %d handled, %d violations, %d duplicates", n, v, d)
	}
}

// The latency is sampled: every event of a stream of up to latencySamples
// events (and every one with --hot-key), from its first poll to the end of
// its handling.
func TestTallySamplesEveryEventOfAShortStream(t *testing.T) {
	evs := make([]trace.Event, 1000)
	for i := range evs {
		evs[i].Key = "k"
	}
	s := newStream(evs)
	ty := newTally(s, workSpec{kind: "none"}, false)
	for seq := range evs {
		r := &kgo.Record{Value: encodeValue(seq, s.ids[seq], s.ord[seq])}
		ty.OnFetchRecordUnbuffered(r, true)
		_ = ty.handle(context.Background(), r)
	}
	for seq, l := range ty.latency {
		if l <= 0 || ty.polled[seq].Load() == 0 {
			t.Fatalf("event %d: latency %d ns, polled at %d", seq, l, ty.polled[seq].Load())
		}
	}
	if r := ty.result("x"); r.P99us <= 0 {
		t.Fatalf("p99 %v µs", r.P99us)
	}
}

// Of a longer stream, about latencySamples events are sampled, spread over
// it: not a fixed stride, which would pick the same positions in every
// round of a --rounds stream.
func TestTallySamplesSpreadOverALongStream(t *testing.T) {
	const rounds, round = 50, 20_000 // --rounds 50 of the sample
	ty := &tally{every: uint64(max(1, rounds*round/latencySamples))}
	if ty.every < 2 {
		t.Fatalf("every %d: the stream is not long enough to sample", ty.every)
	}
	n := 0
	var first []int // the sampled positions of the first round
	same := 0       // sampled positions of later rounds that the first round sampled too
	inFirst := map[int]bool{}
	for seq := range rounds * round {
		if !ty.sampled(seq) {
			continue
		}
		n++
		if seq < round {
			first = append(first, seq)
			inFirst[seq] = true
		} else if inFirst[seq%round] {
			same++
		}
	}
	want := rounds * round / int(ty.every)
	if n < want*9/10 || n > want*11/10 {
		t.Fatalf("%d events sampled of %d, want about %d", n, rounds*round, want)
	}
	// A stride would repeat the first round's positions in each later
	// round; a hash repeats about 1 in every of them.
	if repeat := float64(same) / float64(len(first)*(rounds-1)); repeat > 2/float64(ty.every) {
		t.Fatalf("%.0f%% of the later rounds' samples at the first round's positions", 100*repeat)
	}
}
