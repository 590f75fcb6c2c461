package kafka

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Replay headers, written by Replay on every record it republishes, after
// the record's own headers (decimal-string values, as the dead-letter
// headers). A replayed record that fails again is dead-lettered with them
// (the adapter keeps a record's headers), so its next replay knows its count
// and origin. They are in a namespace of their own: Replay drops the
// adapter's __connect.errors.* headers and these, and keeps every other
// header.
const (
	// HeaderReplayCount is how many times the record has been replayed:
	// 1 on its first replay.
	HeaderReplayCount = "__keysched.replay.count"
	// HeaderReplayDeadLetterTopic, HeaderReplayDeadLetterPartition and
	// HeaderReplayDeadLetterOffset are the dead-letter record the replay
	// was made from.
	HeaderReplayDeadLetterTopic     = "__keysched.replay.dlq.topic"
	HeaderReplayDeadLetterPartition = "__keysched.replay.dlq.partition"
	HeaderReplayDeadLetterOffset    = "__keysched.replay.dlq.offset"
	// HeaderReplayOriginOffset is the offset, in the original partition, of
	// the record as first produced, before any replay: replayed records are
	// produced in its order.
	HeaderReplayOriginOffset = "__keysched.replay.origin.offset"

	replayPrefix = "__keysched.replay."
)

// ErrNotDeadLetter is wrapped by ParseDeadLetter's errors: the headers are
// not those of a dead letter written by this adapter (or its replay headers
// are malformed).
var ErrNotDeadLetter = errors.New("kafka: not one of the adapter's dead letters")

// A DeadLetter is a dead-letter record's headers, parsed by ParseDeadLetter.
type DeadLetter struct {
	// Topic, Partition and Offset are the failed record's coordinates.
	Topic     string
	Partition int32
	Offset    int64
	// Timestamp is the failed record's own timestamp (millisecond
	// precision).
	Timestamp time.Time
	// Group is the consumer group that gave up on it.
	Group string
	// Attempts is the handler attempts made (0 or more).
	Attempts int
	// ErrorClass is the error's Go type (%T; under keysched.Permanent or
	// keysched.Snooze, the wrapped error's); Error its message (a
	// panic: its value); Stack a panic's stack (nil for an error).
	ErrorClass string
	Error      string
	Stack      []byte
	// Headers are the failed record's own headers, in order, without the
	// replay headers (the __keysched.replay.* ones).
	Headers []kgo.RecordHeader
	// Replays is the number of times the failed record had been
	// replayed (HeaderReplayCount; 0 for a record never replayed).
	Replays int
	// ReplayedFrom is the dead letter its last replay was made from
	// (zero when Replays is 0).
	ReplayedFrom Position
	// OriginOffset is the offset of the record as first produced, before
	// any replay (Offset when Replays is 0). Its partition is Partition:
	// Replay writes to the original partition.
	OriginOffset int64
}

// A Position is a record's coordinates.
type Position struct {
	Topic     string
	Partition int32
	Offset    int64
}

func (p Position) String() string { return fmt.Sprintf("%s/%d@%d", p.Topic, p.Partition, p.Offset) }

// errorBlock is the order in which produceDeadLetter appends its headers
// (the stack trace last, for a panic only).
var errorBlock = []string{HeaderTopic, HeaderPartition, HeaderOffset, HeaderTimestamp, HeaderConsumerGroup,
	HeaderAttempts, HeaderExceptionClass, HeaderMessage, HeaderStacktrace}

// ParseDeadLetter parses the headers of a record the adapter dead-lettered:
// the record's own headers followed by the adapter's block of
// __connect.errors.* headers, in the order and the format the adapter
// writes them (a Kafka Connect dead letter, which lacks the timestamp, group
// and attempts, is refused). The block is read from the end, so the record's
// own headers may carry __connect.errors.* names too (a record that was
// already a dead letter upstream). Replay headers among the record's own
// headers fill Replays, ReplayedFrom and OriginOffset (the last occurrence of
// each) and are left out of Headers. Any other shape gives an error wrapping
// ErrNotDeadLetter that says what is wrong. It never panics; the returned
// DeadLetter shares the header values' bytes with hs.
func ParseDeadLetter(hs []kgo.RecordHeader) (DeadLetter, error) {
	n := len(errorBlock) - 1
	if len(hs) > 0 && hs[len(hs)-1].Key == HeaderStacktrace {
		n++
	}
	if len(hs) < n {
		return DeadLetter{}, fmt.Errorf("%w: %d headers, want the adapter's %d %s... headers at the end", ErrNotDeadLetter, len(hs), n, HeaderTopic)
	}
	block := hs[len(hs)-n:]
	for i, h := range block {
		if h.Key != errorBlock[i] {
			return DeadLetter{}, fmt.Errorf("%w: header %d of the last %d is %q, want %q (the adapter's block: %s)",
				ErrNotDeadLetter, i+1, n, h.Key, errorBlock[i], strings.Join(errorBlock[:n], ", "))
		}
	}
	var (
		d   DeadLetter
		err error
	)
	if d.Topic = string(block[0].Value); d.Topic == "" {
		return DeadLetter{}, fmt.Errorf("%w: %s is empty", ErrNotDeadLetter, HeaderTopic)
	}
	if d.Partition, err = parseInt32(block[1]); err != nil {
		return DeadLetter{}, err
	}
	if d.Offset, err = parseNonNegative(block[2]); err != nil {
		return DeadLetter{}, err
	}
	ms, err := strconv.ParseInt(string(block[3].Value), 10, 64)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("%w: %s %q is not a decimal integer", ErrNotDeadLetter, HeaderTimestamp, block[3].Value)
	}
	d.Timestamp = time.UnixMilli(ms)
	d.Group = string(block[4].Value)
	attempts, err := parseInt32(block[5])
	if err != nil {
		return DeadLetter{}, err
	}
	d.Attempts = int(attempts)
	d.ErrorClass, d.Error = string(block[6].Value), string(block[7].Value)
	if n == len(errorBlock) {
		d.Stack = block[8].Value
		if d.Stack == nil {
			d.Stack = []byte{} // present, empty: not nil, which means absent
		}
	}
	if err := d.parseReplay(hs[:len(hs)-n]); err != nil {
		return DeadLetter{}, err
	}
	return d, nil
}

// parseReplay splits own into the record's headers and its replay headers.
func (d *DeadLetter) parseReplay(own []kgo.RecordHeader) error {
	d.OriginOffset = d.Offset
	var seen [5]*kgo.RecordHeader
	names := [5]string{HeaderReplayCount, HeaderReplayDeadLetterTopic, HeaderReplayDeadLetterPartition,
		HeaderReplayDeadLetterOffset, HeaderReplayOriginOffset}
	d.Headers = make([]kgo.RecordHeader, 0, len(own))
	for i := range own {
		h := &own[i]
		if !strings.HasPrefix(h.Key, replayPrefix) {
			d.Headers = append(d.Headers, *h)
			continue
		}
		if j := slices.Index(names[:], h.Key); j >= 0 {
			seen[j] = h
		} else {
			return fmt.Errorf("%w: unknown replay header %q", ErrNotDeadLetter, h.Key)
		}
	}
	present := 0
	for _, h := range seen {
		if h != nil {
			present++
		}
	}
	if present == 0 {
		return nil
	}
	if present != len(seen) {
		return fmt.Errorf("%w: %d of the %d replay headers (%s)", ErrNotDeadLetter, present, len(seen), strings.Join(names[:], ", "))
	}
	count, err := parseInt32(*seen[0])
	if err != nil {
		return err
	}
	if count < 1 {
		return fmt.Errorf("%w: %s is %d, want 1 or more", ErrNotDeadLetter, HeaderReplayCount, count)
	}
	d.Replays = int(count)
	if d.ReplayedFrom.Topic = string(seen[1].Value); d.ReplayedFrom.Topic == "" {
		return fmt.Errorf("%w: %s is empty", ErrNotDeadLetter, HeaderReplayDeadLetterTopic)
	}
	if d.ReplayedFrom.Partition, err = parseInt32(*seen[2]); err != nil {
		return err
	}
	if d.ReplayedFrom.Offset, err = parseNonNegative(*seen[3]); err != nil {
		return err
	}
	if d.OriginOffset, err = parseNonNegative(*seen[4]); err != nil {
		return err
	}
	return nil
}

func parseInt32(h kgo.RecordHeader) (int32, error) {
	v, err := strconv.ParseInt(string(h.Value), 10, 32)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%w: %s %q is not a decimal integer from 0 to 2^31-1", ErrNotDeadLetter, h.Key, h.Value)
	}
	return int32(v), nil
}

func parseNonNegative(h kgo.RecordHeader) (int64, error) {
	v, err := strconv.ParseInt(string(h.Value), 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%w: %s %q is not a decimal integer from 0 to 2^63-1", ErrNotDeadLetter, h.Key, h.Value)
	}
	return v, nil
}

// replayHeaders appends d's own headers and the replay headers of its
// replay number count, made from the dead letter at from.
func (d *DeadLetter) replayHeaders(from Position, count int) []kgo.RecordHeader {
	hs := make([]kgo.RecordHeader, 0, len(d.Headers)+5)
	hs = append(hs, d.Headers...)
	return appendReplayHeaders(hs, count, from, d.OriginOffset)
}

func appendReplayHeaders(hs []kgo.RecordHeader, count int, from Position, origin int64) []kgo.RecordHeader {
	return append(hs,
		kgo.RecordHeader{Key: HeaderReplayCount, Value: strconv.AppendInt(nil, int64(count), 10)},
		kgo.RecordHeader{Key: HeaderReplayDeadLetterTopic, Value: []byte(from.Topic)},
		kgo.RecordHeader{Key: HeaderReplayDeadLetterPartition, Value: strconv.AppendInt(nil, int64(from.Partition), 10)},
		kgo.RecordHeader{Key: HeaderReplayDeadLetterOffset, Value: strconv.AppendInt(nil, from.Offset, 10)},
		kgo.RecordHeader{Key: HeaderReplayOriginOffset, Value: strconv.AppendInt(nil, origin, 10)},
	)
}

// headers encodes d as the adapter writes a dead letter of it: its own
// headers, its replay headers (when Replays > 0), the error block. The
// inverse of ParseDeadLetter (tests hold it to the adapter's own output).
func (d *DeadLetter) headers() []kgo.RecordHeader {
	hs := slices.Clone(d.Headers)
	if d.Replays > 0 {
		hs = appendReplayHeaders(hs, d.Replays, d.ReplayedFrom, d.OriginOffset)
	}
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderTopic, Value: []byte(d.Topic)},
		kgo.RecordHeader{Key: HeaderPartition, Value: strconv.AppendInt(nil, int64(d.Partition), 10)},
		kgo.RecordHeader{Key: HeaderOffset, Value: strconv.AppendInt(nil, d.Offset, 10)},
		kgo.RecordHeader{Key: HeaderTimestamp, Value: strconv.AppendInt(nil, d.Timestamp.UnixMilli(), 10)},
		kgo.RecordHeader{Key: HeaderConsumerGroup, Value: []byte(d.Group)},
		kgo.RecordHeader{Key: HeaderAttempts, Value: strconv.AppendInt(nil, int64(d.Attempts), 10)},
		kgo.RecordHeader{Key: HeaderExceptionClass, Value: []byte(d.ErrorClass)},
		kgo.RecordHeader{Key: HeaderMessage, Value: []byte(d.Error)},
	)
	if d.Stack != nil {
		hs = append(hs, kgo.RecordHeader{Key: HeaderStacktrace, Value: d.Stack})
	}
	return hs
}
