package kafka

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// fuzzHeaders decodes the fuzzer's bytes as headers: key NUL value NUL
// key NUL value ...
func fuzzHeaders(data []byte) []kgo.RecordHeader {
	parts := bytes.Split(data, []byte{0})
	var hs []kgo.RecordHeader
	for i := 0; i+1 < len(parts); i += 2 {
		hs = append(hs, kgo.RecordHeader{Key: string(parts[i]), Value: parts[i+1]})
	}
	return hs
}

func encodeFuzzHeaders(hs []kgo.RecordHeader) []byte {
	var b []byte
	for _, h := range hs {
		b = append(append(append(append(b, h.Key...), 0), h.Value...), 0)
	}
	return b
}

// ParseDeadLetter never panics, refuses with ErrNotDeadLetter, and what it
// accepts encodes back to headers it parses to the same DeadLetter.
func FuzzParseDeadLetter(f *testing.F) {
	plain := dl("orders", 3, 1234, "boom")
	plain.Headers = []kgo.RecordHeader{{Key: "trace", Value: []byte("abc")}, {Key: HeaderTopic, Value: []byte("upstream")}}
	panicked := dl("orders", 0, 7, "nil map")
	panicked.ErrorClass, panicked.Stack = "*keysched.PanicError", []byte("goroutine 1 [running]:\nmain.main()")
	replayed := dl("orders", 1, 99, "again")
	replayed.Replays, replayed.ReplayedFrom, replayed.OriginOffset = 2, Position{"orders.dlq", 0, 17}, 5
	for _, d := range []DeadLetter{plain, panicked, replayed} {
		f.Add(encodeFuzzHeaders(d.headers()))
	}
	f.Add([]byte("__connect.errors.topic\x00t\x00__connect.errors.partition\x00-1\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		hs := fuzzHeaders(data)
		d, err := ParseDeadLetter(hs)
		if err != nil {
			if !errors.Is(err, ErrNotDeadLetter) {
				t.Fatalf("error %v does not wrap ErrNotDeadLetter", err)
			}
			return
		}
		if hasStack := hs[len(hs)-1].Key == HeaderStacktrace; hasStack != (d.Stack != nil) {
			t.Fatalf("stack trace header present %v, Stack %q", hasStack, d.Stack)
		}
		d2, err := ParseDeadLetter(d.headers())
		if err != nil {
			t.Fatalf("%+v encodes to headers that do not parse: %v", d, err)
		}
		if !reflect.DeepEqual(d, d2) {
			t.Fatalf("round trip:\n%+v\n%+v", d, d2)
		}
	})
}

func TestParseDeadLetterAcceptsOnlyTheAdaptersShape(t *testing.T) {
	gd := dl("t", 0, 1, "boom")
	good := gd.headers()
	with := func(key, value string) []kgo.RecordHeader {
		hs := make([]kgo.RecordHeader, len(good))
		copy(hs, good)
		for i := range hs {
			if hs[i].Key == key {
				hs[i].Value = []byte(value)
			}
		}
		return hs
	}
	replayHs := func(drop string) []kgo.RecordHeader {
		hs := appendReplayHeaders(nil, 1, Position{"dlq", 0, 0}, 1)
		out := hs[:0]
		for _, h := range hs {
			if h.Key != drop {
				out = append(out, h)
			}
		}
		return append(out, good...)
	}
	connect := []kgo.RecordHeader{ // Kafka Connect's dead letter: no timestamp, group, attempts
		{Key: HeaderTopic, Value: []byte("t")}, {Key: HeaderPartition, Value: []byte("0")}, {Key: HeaderOffset, Value: []byte("1")},
		{Key: HeaderExceptionClass, Value: []byte("java.lang.Exception")}, {Key: HeaderMessage, Value: []byte("x")},
	}
	for _, c := range []struct {
		name string
		hs   []kgo.RecordHeader
		want string
	}{
		{"no headers", nil, "0 headers"},
		{"Kafka Connect's", connect, "header"},
		{"block out of order", append(good[1:2:2], append(good[:1:1], good[2:]...)...), "want \"__connect.errors.topic\""},
		{"a header after the block", append(good[:len(good):len(good)], kgo.RecordHeader{Key: "late"}), "want"},
		{"empty topic", with(HeaderTopic, ""), "is empty"},
		{"negative partition", with(HeaderPartition, "-1"), "partition \"-1\""},
		{"partition too big", with(HeaderPartition, "2147483648"), "partition"},
		{"bad offset", with(HeaderOffset, "x"), "offset \"x\""},
		{"bad timestamp", with(HeaderTimestamp, "1.5"), "timestamp"},
		{"bad attempts", with(HeaderAttempts, ""), "attempts"},
		{"partial replay headers", replayHs(HeaderReplayOriginOffset), "4 of the 5 replay headers"},
		{"replay count 0", append(appendReplayHeaders(nil, 0, Position{"dlq", 0, 0}, 1), good...), "want 1 or more"},
		{"unknown replay header", append([]kgo.RecordHeader{{Key: "__keysched.replay.x"}}, good...), "unknown replay header"},
	} {
		_, err := ParseDeadLetter(c.hs)
		if !errors.Is(err, ErrNotDeadLetter) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrNotDeadLetter saying %q", c.name, err, c.want)
		}
	}
	// A stack trace header with a nil value (as a fetch may decode an
	// empty one) is a panic's stack all the same.
	d, err := ParseDeadLetter(append(good[:len(good):len(good)], kgo.RecordHeader{Key: HeaderStacktrace}))
	if err != nil || d.Stack == nil || len(d.headers()) != len(good)+1 {
		t.Errorf("empty stack trace: %+v, %v", d, err)
	}
	d, err = ParseDeadLetter(good)
	if err != nil || d.Topic != "t" || d.Offset != 1 || d.OriginOffset != 1 || d.Timestamp != time.UnixMilli(1e12+1) || d.Stack != nil {
		t.Errorf("good: %+v, %v", d, err)
	}
}
