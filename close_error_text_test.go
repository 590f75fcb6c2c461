package keysched

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// A *CloseError reads as one sentence, the cause first, without the
// ErrAborted sentinel's text in parentheses and without counts of zero; it
// still matches ErrAborted and the cause with errors.Is. The count covers
// tasks that had run (parked, or waiting to run again): the text says they
// will not run again rather than that they did not run.
func TestCloseErrorTextIsOneSentence(t *testing.T) {
	for _, c := range []struct {
		e    CloseError
		want string
	}{
		{CloseError{NotRun: 770, Running: 2, Undelivered: 3, Cause: context.DeadlineExceeded},
			"keysched: Close gave up (context deadline exceeded): 770 accepted tasks did not run or will not run again, 2 still running, 3 dead letters not yet delivered"},
		{CloseError{NotRun: 1, Unreached: 5, Undelivered: 1, Cause: context.Canceled},
			"keysched: Close gave up (context canceled): 1 accepted task did not run or will not run again, 5 not yet reached by the abort, 1 dead letter not yet delivered"},
		{CloseError{Cause: context.Canceled},
			"keysched: Close gave up (context canceled): 0 accepted tasks did not run or will not run again"},
	} {
		err := error(&c.e)
		if got := err.Error(); got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
		if strings.Contains(err.Error(), ErrAborted.Error()) {
			t.Errorf("%q repeats the sentinel's text", err)
		}
		if !errors.Is(err, ErrAborted) || !errors.Is(err, c.e.Cause) {
			t.Errorf("%q: errors.Is(ErrAborted) %v, errors.Is(cause) %v", err, errors.Is(err, ErrAborted), errors.Is(err, c.e.Cause))
		}
	}
}
