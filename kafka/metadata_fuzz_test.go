package kafka

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The commit metadata is read back from the broker, where anyone sharing the
// group may have written it: decoding any string never panics, and what it
// claims finished is exactly the runs the string spells, ascending, above the
// committed offset, without an overflow turning a run around.
func FuzzDecodeFinished(f *testing.F) {
	valid, _ := encodeFinished(100, []int64{100, 105, 106, 200}, true, 1000, 4096)
	big := strconv.FormatInt(1<<62, 36)
	for _, s := range []struct {
		meta string
		base int64
	}{
		{valid, 100}, {valid, 101}, {"", 0}, {"ks1:", 0}, {"ks1:0:1.1", 0}, {"ks1:2s:0.1", 100},
		{"ks1:2s:1.-1", 100}, {"ks1:2s:+1.1", 100}, {"ks1:2s:001.1,1.1", 100},
		{"ks1:0:" + big + ".1," + big + ".1", 0},     // the second run's start overflows int64
		{"ks1:0:" + big + "." + big + ",1.1", 0},     // a run's end overflows
		{"ks1:-" + big + ":" + big + ".1", -1 << 62}, // a negative base
	} {
		f.Add(s.meta, s.base)
	}
	f.Fuzz(func(t *testing.T, meta string, base int64) {
		spans := decodeFinished(meta, base)
		if spans == nil {
			return
		}
		prev := base
		for _, s := range spans {
			if s.from <= prev || s.to < s.from {
				t.Fatalf("%q (base %d) decodes to %v: run %v is not above %d or ends before it starts", meta, base, spans, s, prev)
			}
			prev = s.to
		}
		// One span per run written, and the canonical spelling of those
		// spans decodes to the same claim.
		_, runs, _ := strings.Cut(strings.TrimPrefix(meta, metaPrefix), ":")
		if n := strings.Count(runs, ",") + 1; n != len(spans) {
			t.Fatalf("%q: %d runs written, %d spans claimed", meta, n, len(spans))
		}
		if again := decodeFinished(canonicalMeta(base, spans), base); !slices.Equal(again, spans) {
			t.Fatalf("%q decodes to %v, its canonical form %q to %v", meta, spans, canonicalMeta(base, spans), again)
		}
	})
}

// canonicalMeta spells spans in the format encodeFinished writes.
func canonicalMeta(base int64, spans []span) string {
	var b strings.Builder
	b.WriteString(metaPrefix + strconv.FormatInt(base, 36) + ":")
	prev := base
	for i, s := range spans {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s.%s", strconv.FormatInt(s.from-prev, 36), strconv.FormatInt(s.to-s.from+1, 36))
		prev = s.to
	}
	return b.String()
}

// decode(encode(x)) == x: the finished offsets a consumer writes are the
// ones a new owner reads back (all of them, or when the limit cuts the
// encoding, the runs nearest the frontier and nothing else), and the
// encoding never exceeds the limit.
func FuzzFinishedRoundTrip(f *testing.F) {
	f.Add(int64(100), []byte{0, 4, 0, 93}, true, uint16(800), uint16(4096))
	f.Add(int64(0), []byte{0, 1, 1, 1, 1, 1}, true, uint16(2), uint16(17))
	f.Add(int64(0), []byte{0, 1}, true, uint16(10), uint16(5))
	f.Add(int64(7), []byte{3, 200, 255}, false, uint16(50), uint16(64))
	f.Add(int64(1)<<40, []byte{}, true, uint16(9), uint16(100))
	f.Fuzz(func(t *testing.T, base int64, gaps []byte, complete bool, tail, limit uint16) {
		if base < 0 || base > 1<<40 {
			return // Kafka offsets: non-negative, and far from overflowing here
		}
		// The unfinished offsets: base, then each gap's distance above the last.
		unfinished := []int64{base}
		for _, g := range gaps {
			unfinished = append(unfinished, unfinished[len(unfinished)-1]+int64(g)+1)
		}
		last := unfinished[len(unfinished)-1]
		highest := last + int64(tail)
		meta, truncated := encodeFinished(base, unfinished, complete, highest, int(limit))
		if len(meta) > int(limit) {
			t.Fatalf("encoding of %d bytes over the limit %d", len(meta), limit)
		}
		// The model: the finished runs in (base, top], top the highest
		// offset the list speaks for.
		top := last
		if complete {
			top = highest
		}
		var want []span
		for i, u := range unfinished {
			next := top + 1
			if i+1 < len(unfinished) {
				next = unfinished[i+1]
			}
			if next > u+1 {
				want = append(want, span{u + 1, min(next-1, top)})
			}
		}
		got := decodeFinished(meta, base)
		if meta == "" {
			if len(want) > 0 && !truncated {
				t.Fatalf("nothing encoded, not truncated, but %v finished", want)
			}
			return
		}
		if truncated {
			if len(got) >= len(want) || !slices.Equal(got, want[:len(got)]) {
				t.Fatalf("truncated %q decodes to %v, want a proper prefix of %v", meta, got, want)
			}
			return
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%q decodes to %v, want %v", meta, got, want)
		}
	})
}
