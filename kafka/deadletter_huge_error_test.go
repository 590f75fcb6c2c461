package kafka

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A record whose error message (or panic stack) is larger than a record
// the client may produce is dead-lettered all the same, with the message
// and the stack cut to MaxHeaderMessageBytes and MaxHeaderStacktraceBytes,
// saying how much was cut. Before, the dead-letter produce failed with
// MESSAGE_TOO_LARGE on every retry, for ever: the record was never
// finished, and its key and its partition's frontier stood still.
func TestDeadLetterOfAHugeErrorIsWrittenCut(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	tc.produce(t, rec("t", 0, "k", "v0"), rec("t", 0, "k", "v1"), rec("t", 0, "k", "v2"))
	huge := strings.Repeat("é", 1<<20) // 2 MiB, runes of two bytes
	h := func(_ context.Context, r *kgo.Record) error {
		switch r.Offset {
		case 0:
			return keysched.Permanent(errors.New("boom " + huge))
		case 1:
			return keysched.Permanent(&keysched.PanicError{Value: "bad", Stack: []byte(huge)})
		}
		return nil
	}
	commits := tc.watchCommits(t)
	startConsumer(t, h, WithLogger(quiet), WithDeadLetterTopic("dlq"), WithCommitInterval(5*time.Millisecond),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	dead := tc.readAll(t, "dlq", 2)
	msg, _ := header(dead[0], HeaderMessage)
	if len(msg) > MaxHeaderMessageBytes || !strings.HasPrefix(msg, "boom éé") || !strings.HasSuffix(msg, " bytes cut]") {
		t.Errorf("message of %d bytes: %.20q...%q", len(msg), msg, msg[max(0, len(msg)-40):])
	}
	stack, _ := header(dead[1], HeaderStacktrace)
	if len(stack) > MaxHeaderStacktraceBytes || !strings.HasPrefix(stack, "éé") || !strings.HasSuffix(stack, " bytes cut]") {
		t.Errorf("stack of %d bytes: %.20q...%q", len(stack), stack, stack[max(0, len(stack)-40):])
	}
	if !utf8.ValidString(msg) || !utf8.ValidString(stack) {
		t.Errorf("a cut falls inside a rune")
	}
	eventually(t, "commit past the dead letters", func() bool {
		cs := commits.of("t", 0)
		return len(cs) > 0 && cs[len(cs)-1].Offset == 3
	})
}
