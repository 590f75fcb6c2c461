package kafka

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A dead letter's error class (HeaderExceptionClass, DeadLetter.ErrorClass)
// names the handler's error, not keysched's markers around it: a record
// failed with keysched.Permanent(err), or Permanent over Snooze, reports
// err's type (a new user saw *keysched.permanentError, an unexported
// wrapper). A wrapper of the handler's own (fmt.Errorf's %w) is its class.
func TestDeadLetterClassNamesTheErrorInsideKeyschedsMarkers(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	tc.produce(t, rec("t", 0, "a", "0"), rec("t", 0, "b", "1"), rec("t", 0, "c", "2"), rec("t", 0, "d", "3"))
	pathErr := &fs.PathError{Op: "open", Path: "/x", Err: fs.ErrNotExist}
	errs := []error{
		keysched.Permanent(pathErr),
		keysched.Permanent(keysched.Snooze(pathErr, time.Hour)),
		fmt.Errorf("handler: %w", keysched.Permanent(pathErr)),
		keysched.Permanent(errors.New("plain")),
	}
	want := map[int64]string{0: "*fs.PathError", 1: "*fs.PathError", 2: "*fmt.wrapError", 3: "*errors.errorString"}
	startConsumer(t, func(_ context.Context, r *kgo.Record) error { return errs[r.Offset] },
		WithLogger(quiet), WithDeadLetterTopic("dlq"),
		WithSchedulerOptions(keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	for _, d := range tc.readAll(t, "dlq", len(errs)) {
		dl, err := ParseDeadLetter(d.Headers)
		if err != nil {
			t.Fatal(err)
		}
		if dl.ErrorClass != want[dl.Offset] {
			t.Errorf("offset %d: ErrorClass %q, want %q", dl.Offset, dl.ErrorClass, want[dl.Offset])
		}
		if wantMsg := errs[dl.Offset].Error(); dl.Error != wantMsg {
			t.Errorf("offset %d: Error %q, want %q", dl.Offset, dl.Error, wantMsg)
		}
		if dl.Attempts != 1 {
			t.Errorf("offset %d: %d attempts, want 1 (Permanent is not retried)", dl.Offset, dl.Attempts)
		}
	}
}
