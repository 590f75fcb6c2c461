package kafka

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrNotCommitted is matched (errors.Is) by the error of a Close that could
// not commit every frontier of the partitions it owned: the records below
// those frontiers are finished, yet the next owner starts at the last
// committed offset and handles them again. errors.As finds the details in a
// *CommitError.
var ErrNotCommitted = errors.New("kafka: frontier not committed")

// CloseMargin bounds how long Close runs after its context ends (or after
// it starts, for a context that had already ended): its final commit gets up
// to a second of its own past the context, reading the offsets back and
// leaving the group up to 1.5 s past it, then franz-go's own shutdown up to
// one more second (closing its fetch sessions, its last telemetry push,
// with a broker that does not answer: the consumer then ends the client's
// context, which fails franz-go's requests in flight) and the scheduler's
// close 250 ms plus keysched.CloseGrace. Close returns within its context
// plus CloseMargin whatever the brokers do (on a loaded machine the
// goroutine that runs Close may get the CPU back later than that, as with
// any timer). The bound needs the client's context to be the consumer's:
// with a kgo.WithContext of the caller's among WithClientOptions, a
// coordinator answering no LeaveGroup can hold franz-go's shutdown up to
// its request retry timeout (30 s by default), until that context ends.
const CloseMargin = 3 * time.Second

const (
	finalCommitGrace = time.Second             // the final commit's time past Close's context
	leaveGrace       = 1500 * time.Millisecond // leaving the group: until this long past Close's context
	clientCloseGrace = time.Second             // franz-go's own shutdown, past leaving's time
	schedCloseGrace  = 250 * time.Millisecond  // the scheduler's close, once the rest is done
)

// An UncommittedPartition is a frontier a commit could not write.
type UncommittedPartition struct {
	Topic     string
	Partition int32
	// Offset is the frontier that was not committed; Committed the
	// partition's last committed offset (-1 if none), where the next
	// owner starts.
	Offset, Committed int64
	// Err is the last error: the broker's for the partition (a
	// *kerr.Error such as kerr.CoordinatorNotAvailable, matched with
	// errors.Is), or the request's (a network error, or the context's
	// when the commit ran out of time).
	Err error
}

// CommitError is returned (wrapped, possibly joined with the unfinished
// records' error) by a Close that could not commit every frontier. It
// matches ErrNotCommitted with errors.Is, and each partition's Err too.
type CommitError struct {
	// Partitions lists the frontiers not committed, by topic then
	// partition.
	Partitions []UncommittedPartition
}

func (e *CommitError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kafka: %d frontiers not committed (the next owner handles their records again from the committed offset):", len(e.Partitions))
	for i, p := range e.Partitions {
		if i > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, " %s/%d at %d (committed %d): %v", p.Topic, p.Partition, p.Offset, p.Committed, p.Err)
	}
	return b.String()
}

// Is reports target == ErrNotCommitted.
func (e *CommitError) Is(target error) bool { return target == ErrNotCommitted }

// Unwrap returns the partitions' errors.
func (e *CommitError) Unwrap() []error {
	out := make([]error, 0, len(e.Partitions))
	for _, p := range e.Partitions {
		if p.Err != nil {
			out = append(out, p.Err)
		}
	}
	return out
}
