package trace

import (
	"bytes"
	"compress/gzip"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// The streams keybench and kafkabench read (--trace FILE, plain or gzipped
// TSV) come from anywhere: Load never panics, fails with a *ParseError that
// names a line (or an error about the gzip or the reader), and what it accepts
// is written back by Write and loaded again unchanged: decode(encode(x)) == x.
func FuzzLoad(f *testing.F) {
	// Not Sample(): loading 20,000 events in every fuzz worker outlasts a
	// 3 s run's baseline.
	ev, err := Synthetic(5, 3, 1.5, 1)
	if err != nil {
		f.Fatal(err)
	}
	var tsv bytes.Buffer
	if err := Write(&tsv, ev); err != nil {
		f.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tsv.Bytes())
	zw.Close()
	z40 := strings.Repeat("0", 40)
	a40 := strings.Repeat("a", 40)
	for _, s := range [][]byte{
		tsv.Bytes(), gz.Bytes(), gz.Bytes()[:len(gz.Bytes())/2], {},
		[]byte("# header\n\n0\t1\t" + a40 + "\tk\t" + z40 + "\t" + a40 + "\tA\r\n"),
		[]byte("0\t1\t" + a40 + "\tk\t" + z40 + "\t" + a40 + "\tX\n"),
		[]byte("-1\t1\t" + a40 + "\tk\t" + z40 + "\t" + a40 + "\tA\n"),
		[]byte("0\t1\t" + a40 + "\t\t" + z40 + "\t" + a40 + "\tA\n"),
		[]byte("0\t1\t" + a40 + "\tk\t" + z40 + "\n"),
		[]byte("0\t1\t" + strings.Repeat("b", 64) + "\t\"q\\303\\244\"\t" + z40 + "\t" + a40 + "\tM\n"),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		events, err := Load(bytes.NewReader(data))
		if err != nil {
			var pe *ParseError
			if errors.As(err, &pe) && (pe.Line < 1 || pe.Msg == "") {
				t.Fatalf("parse error without a line or a reason: %#v", pe)
			}
			return
		}
		roundTrip(t, events)
	})
}

// The git log output keybench --git DIR reads: ParseGitLog never panics,
// and the stream it makes is one Write and Load carry unchanged.
func FuzzParseGitLog(f *testing.F) {
	a40 := strings.Repeat("a", 40)
	b40 := strings.Repeat("b", 40)
	z40 := strings.Repeat("0", 40)
	for _, s := range []string{
		"C " + a40 + " 1112911993\n:000000 100644 " + z40 + " " + b40 + " A\tMakefile\n",
		"C " + a40 + " 1\n\n:100644 100644 " + b40 + " " + a40 + " M\t\"g\\303\\244\"\n:100644 000000 " + a40 + " " + z40 + " D\tx\n",
		":000000 100644 " + z40 + " " + b40 + " A\tno commit yet\n",
		"C " + a40 + " x\n",
		"C " + a40 + " 1\n:100644 100644 " + b40 + " " + a40 + " R100\told\tnew\n",
		"C " + a40 + " 1\n:100644 100644 " + b40 + " " + a40 + " M\tpath with\ttab\n",
		"C " + a40 + " 1\n:100644 100644 " + b40 + " " + a40 + " M\tcr\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		events, err := ParseGitLog(bytes.NewReader(data))
		if err != nil {
			return
		}
		roundTrip(t, events)
	})
}

// roundTrip checks that events are well formed and that Write then Load
// gives them back.
func roundTrip(t *testing.T, events []Event) {
	t.Helper()
	for i, e := range events {
		if e.Key == "" || strings.ContainsAny(e.Key, "\t\n") ||
			!isHexID([]byte(e.Commit)) || !isHexID([]byte(e.PrevBlob)) || !isHexID([]byte(e.NextBlob)) || !validStatus(e.Status) || e.Seq < 0 {
			t.Fatalf("event %d accepted but malformed: %+v", i, e)
		}
	}
	var buf bytes.Buffer
	if err := Write(&buf, events); err != nil {
		t.Fatal(err)
	}
	again, err := Load(&buf)
	if err != nil {
		t.Fatalf("Load of what Write wrote: %v\n%s", err, buf.Bytes())
	}
	if len(again) != len(events) || (len(events) > 0 && !reflect.DeepEqual(again, events)) {
		t.Fatalf("round trip changed the stream:\n%+v\n%+v", events, again)
	}
}
