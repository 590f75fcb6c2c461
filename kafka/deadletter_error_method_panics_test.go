package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kgo"
)

// derefError's Error dereferences its receiver: a nil *derefError returned
// as an error is a non-nil error whose Error panics.
type derefError struct{ msg string }

func (e *derefError) Error() string { return e.msg }

// A handler error whose Error method panics (a nil pointer of an error
// type, returned as a non-nil error) becomes a dead letter like any other,
// with fmt's text for it ("<nil>") and its type as the class, and the
// record is finished (its offset committed). Before, the dead-letter
// function panicked computing the message (keysched logged "dead-letter
// function or logger did not return"): no dead letter, and the record was
// never finished, holding its partition's commit there for good.
func TestHandlerErrorWhoseErrorMethodPanicsIsDeadLettered(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	tc.produce(t, rec("t", 0, "a", "0"))
	c := startConsumer(t, func(context.Context, *kgo.Record) error {
		var e *derefError
		return e
	},
		WithLogger(quiet), WithDeadLetterTopic("dlq"), WithCommitInterval(20*time.Millisecond),
		WithSchedulerOptions(keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond})),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	ds := tc.readAll(t, "dlq", 1)
	dl, err := ParseDeadLetter(ds[0].Headers)
	if err != nil {
		t.Fatal(err)
	}
	if dl.Error != "<nil>" || dl.ErrorClass != "*kafka.derefError" {
		t.Errorf("dead letter Error %q, ErrorClass %q; want \"<nil>\", \"*kafka.derefError\"", dl.Error, dl.ErrorClass)
	}
	eventually(t, "the record finished", func() bool {
		ps, ok := c.partStats("t", 0)
		return ok && ps.Committed == 1
	})
}
