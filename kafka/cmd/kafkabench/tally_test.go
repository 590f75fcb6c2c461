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

// The latency is sampled: every latencyEvery-th event (every one with
// --hot-key), from its first poll to the end of its handling.
func TestTallySamplesLatency(t *testing.T) {
	evs := make([]trace.Event, 2*latencyEvery+1)
	for i := range evs {
		evs[i].Key = "k"
	}
	s := newStream(evs)
	for _, hot := range []bool{false, true} {
		ty := newTally(s, workSpec{kind: "none"}, hot)
		want := 3 // seq 0, 64 and 128
		if hot {
			want = len(evs)
		}
		if len(ty.latency) != want {
			t.Fatalf("hot %v: %d latency samples, want %d", hot, len(ty.latency), want)
		}
		for seq := range evs {
			r := &kgo.Record{Value: encodeValue(seq, s.ids[seq], s.ord[seq])}
			ty.OnFetchRecordUnbuffered(r, true)
			_ = ty.handle(context.Background(), r)
		}
		for i, l := range ty.latency {
			if l <= 0 || ty.polled[i].Load() == 0 {
				t.Fatalf("hot %v: sample %d: latency %d ns, polled at %d", hot, i, l, ty.polled[i].Load())
			}
		}
	}
}
