// Package trace loads and makes keyed event streams for keysched's
// benchmarks and end-to-end tests.
//
// A stream is a slice of Events in publication order. Every event carries a
// precondition: the state its key must be in before it applies (PrevBlob) and
// the state it leaves (NextBlob). Applied in publication order per key, every
// precondition holds; any reordering of two events of one key breaks one. The
// format is a TSV (the project's cmd/keybench/data/README.md describes the real
// stream it was first made from), optionally gzipped, whose first line is a
// header starting with '#':
//
//	# seq	unix_time	commit	key	prev_blob	next_blob	status
//	0	1112911993	e83c5163…	Makefile	0000…0000	a6bba79b…	A
//
// seq is the 0-based publication order; unix_time the commit time in
// seconds; commit the commit id (40 hex); key the file path as git prints it;
// prev_blob the blob id of the file before the change (40 zeros when added)
// and next_blob after it (40 zeros when deleted); status A, M, D or T.
//
// Streams come from a file (Load, LoadFile: plain or gzipped TSV), from a
// local git repository's first-parent history (FromGit), from a generator
// (Synthetic), or from the sample embedded in this package (Sample: the first
// 20,000 events of the history of git/git). Rounds makes a longer stream.
package trace

import (
	"bufio"
	"bytes"
	"compress/gzip"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Event is one keyed event: the change of one file (Key) by one commit.
type Event struct {
	Seq      int64  // 0-based position in the stream as read (publication order)
	UnixTime int64  // commit time, seconds since the epoch
	Commit   string // commit id (hex)
	Key      string // the key: a file path as git prints it (unusual names quoted)
	PrevBlob string // the key's state this event expects; all zeros when absent
	NextBlob string // the key's state after this event; all zeros when deleted
	Status   byte   // 'A' added, 'M' modified, 'D' deleted, 'T' type changed
}

// Header is the first line of a stream written by Write.
const Header = "# seq\tunix_time\tcommit\tkey\tprev_blob\tnext_blob\tstatus"

// numFields is the number of tab-separated fields of an event line.
const numFields = 7

var tab = []byte{'\t'}

// IsZero reports whether a blob id is all zeros: the state of an absent key.
func IsZero(blob string) bool {
	if blob == "" {
		return false
	}
	for i := 0; i < len(blob); i++ {
		if blob[i] != '0' {
			return false
		}
	}
	return true
}

// Holds reports whether an event whose precondition is prev may apply to a
// key whose state is cur, where cur == "" means the key has no state yet
// (which matches an all-zeros prev).
func Holds(cur, prev string) bool {
	if cur == "" {
		return IsZero(prev)
	}
	return cur == prev
}

// ParseError is returned by Load for a malformed line.
type ParseError struct {
	Line int    // 1-based line number in the (decompressed) input
	Msg  string // what is wrong with it
}

func (e *ParseError) Error() string { return fmt.Sprintf("trace: line %d: %s", e.Line, e.Msg) }

// Load reads a stream in the TSV format from r, which may be gzipped (it is
// recognised by its magic bytes). Lines starting with '#' and empty lines are
// skipped. A malformed line makes Load fail with a *ParseError that gives its
// line number. Keys and commit ids are interned: events of one key share one
// string.
func Load(r io.Reader) ([]Event, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("trace: gzip: %w", err)
		}
		defer zr.Close()
		return parse(zr)
	}
	return parse(br)
}

// LoadFile reads the stream in the file at path (plain or gzipped TSV).
func LoadFile(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	ev, err := Load(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ev, nil
}

func parse(r io.Reader) ([]Event, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var (
		events []Event
		in     interner
		fields [numFields][]byte
		line   int
	)
	for sc.Scan() {
		line++
		b := bytes.TrimSuffix(sc.Bytes(), []byte{'\r'})
		if len(b) == 0 || b[0] == '#' {
			continue
		}
		if n := bytes.Count(b, tab) + 1; n != numFields {
			return nil, &ParseError{line, fmt.Sprintf("want %d tab-separated fields (seq, unix_time, commit, key, prev_blob, next_blob, status), got %d", numFields, n)}
		}
		rest := b
		for j := range numFields - 1 {
			i := bytes.IndexByte(rest, '\t')
			fields[j], rest = rest[:i], rest[i+1:]
		}
		fields[numFields-1] = rest
		ev, err := parseFields(&fields, &in)
		if err != nil {
			return nil, &ParseError{line, err.Error()}
		}
		events = append(events, ev)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &ParseError{line + 1, "line longer than 1 MiB"}
		}
		return nil, fmt.Errorf("trace: reading line %d: %w", line+1, err)
	}
	return events, nil
}

func parseFields(f *[numFields][]byte, in *interner) (Event, error) {
	seq, err := strconv.ParseInt(string(f[0]), 10, 64)
	if err != nil || seq < 0 {
		return Event{}, fmt.Errorf("seq %q is not a non-negative integer", f[0])
	}
	ut, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil {
		return Event{}, fmt.Errorf("unix_time %q is not an integer", f[1])
	}
	if !isHexID(f[2]) {
		return Event{}, fmt.Errorf("commit %q is not a 40- or 64-digit hex id", f[2])
	}
	if len(f[3]) == 0 {
		return Event{}, errors.New("empty key")
	}
	if !isHexID(f[4]) {
		return Event{}, fmt.Errorf("prev_blob %q is not a 40- or 64-digit hex id", f[4])
	}
	if !isHexID(f[5]) {
		return Event{}, fmt.Errorf("next_blob %q is not a 40- or 64-digit hex id", f[5])
	}
	if len(f[6]) != 1 || !validStatus(f[6][0]) {
		return Event{}, fmt.Errorf("status %q is not one of A, M, D, T", f[6])
	}
	return Event{
		Seq:      seq,
		UnixTime: ut,
		Commit:   in.get(f[2]),
		Key:      in.get(f[3]),
		PrevBlob: in.get(f[4]),
		NextBlob: in.get(f[5]),
		Status:   f[6][0],
	}, nil
}

func validStatus(c byte) bool { return c == 'A' || c == 'M' || c == 'D' || c == 'T' }

// isHexID reports whether b is a full SHA-1 (40) or SHA-256 (64) hex id.
func isHexID(b []byte) bool {
	if len(b) != 40 && len(b) != 64 {
		return false
	}
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// interner shares one string per distinct value: a key's events, a commit's
// events, and the blob that one event writes and the next one expects.
type interner map[string]string

func (in *interner) get(b []byte) string {
	if *in == nil {
		*in = make(map[string]string)
	}
	if s, ok := (*in)[string(b)]; ok {
		return s
	}
	s := string(b)
	(*in)[s] = s
	return s
}

// Write writes events in the TSV format, header first. Load reads it back.
func Write(w io.Writer, events []Event) error {
	bw := bufio.NewWriter(w)
	bw.WriteString(Header)
	bw.WriteByte('\n')
	for i := range events {
		e := &events[i]
		fmt.Fprintf(bw, "%d\t%d\t%s\t%s\t%s\t%s\t%c\n", e.Seq, e.UnixTime, e.Commit, e.Key, e.PrevBlob, e.NextBlob, e.Status)
	}
	return bw.Flush()
}

//go:embed sample.tsv.gz
var sampleGz []byte

// SampleSize is the size in bytes of the embedded sample, gzipped.
var SampleSize = len(sampleGz)

// Sample returns the stream embedded in this package: the first 20,000
// events (up to a commit boundary) of cmd/keybench/data/git-history.tsv.gz, the
// first-parent history of git/git, with 1,794 keys. Each call returns a fresh
// slice. It panics only if the embedded file is corrupt (a build error).
func Sample() []Event {
	ev, err := Load(bytes.NewReader(sampleGz))
	if err != nil {
		panic("trace: embedded sample is corrupt: " + err.Error())
	}
	return ev
}

// Rounds returns r copies of events one after another, the keys of copy i
// prefixed with "i/" so that each copy is an independent set of chains (the
// convention of cmd/keybench/data/README.md), Seq renumbered from 0. For r <= 1 it
// returns a copy of events unchanged.
func Rounds(events []Event, r int) []Event {
	if r <= 1 {
		return append([]Event(nil), events...)
	}
	out := make([]Event, 0, len(events)*r)
	var in interner
	for round := range r {
		prefix := strconv.Itoa(round) + "/"
		for _, e := range events {
			e.Key = in.get([]byte(prefix + e.Key))
			e.Seq = int64(len(out))
			out = append(out, e)
		}
	}
	return out
}

// Limit returns the first n events (all of them when n <= 0 or n >=
// len(events)). It shares events' backing array.
func Limit(events []Event, n int) []Event {
	if n <= 0 || n >= len(events) {
		return events
	}
	return events[:n:n]
}

// Replay applies events sequentially, in publication order: the reference a
// concurrent replay is compared with. It returns the final state (key to the
// NextBlob of its last event) and how many events found their precondition
// broken (0 for a well-formed stream).
func Replay(events []Event) (final map[string]string, broken int) {
	final = make(map[string]string)
	for i := range events {
		e := &events[i]
		if !Holds(final[e.Key], e.PrevBlob) {
			broken++
		}
		final[e.Key] = e.NextBlob
	}
	return final, broken
}

// CheckChain returns an error describing the first event whose precondition
// does not hold when events are applied in order, or nil.
func CheckChain(events []Event) error {
	state := make(map[string]string)
	for i := range events {
		e := &events[i]
		if cur := state[e.Key]; !Holds(cur, e.PrevBlob) {
			if cur == "" {
				cur = "(absent)"
			}
			return fmt.Errorf("trace: event %d (seq %d, key %s): expects %s, key is at %s", i, e.Seq, e.Key, e.PrevBlob, cur)
		}
		state[e.Key] = e.NextBlob
	}
	return nil
}

// Summary describes a stream.
type Summary struct {
	Events int
	Keys   int
	// Hottest is the key with the most events (the first to reach that count
	// on a tie) and HottestEvents its count; "" and 0 for an empty stream.
	Hottest       string
	HottestEvents int
}

// Summarize counts events and keys and finds the hottest key.
func Summarize(events []Event) Summary {
	counts := make(map[string]int)
	var s Summary
	for i := range events {
		k := events[i].Key
		c := counts[k] + 1
		counts[k] = c
		if c > s.HottestEvents {
			s.Hottest, s.HottestEvents = k, c
		}
	}
	s.Events, s.Keys = len(events), len(counts)
	return s
}

// KeyIDs numbers the distinct keys densely in order of first appearance:
// ids[i] is the number of events[i]'s key, and keys[id] is that key.
func KeyIDs(events []Event) (ids []int32, keys []string) {
	index := make(map[string]int32)
	ids = make([]int32, len(events))
	for i := range events {
		k := events[i].Key
		id, ok := index[k]
		if !ok {
			id = int32(len(keys))
			index[k] = id
			keys = append(keys, k)
		}
		ids[i] = id
	}
	return ids, keys
}

// ZeroID is the all-zeros SHA-1 id: the state of an absent key.
var ZeroID = strings.Repeat("0", 40)
