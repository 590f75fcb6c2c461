package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// derefError's Error dereferences its receiver: a nil *derefError returned
// as an error is a non-nil error whose Error panics.
type derefError struct{ msg string }

func (e *derefError) Error() string { return e.msg }

// A sink error whose Error method panics (a nil pointer of an error type,
// returned as a non-nil error) is marked dead like any other, with fmt's
// text for it. Before, the dead mark panicked computing the stored text
// (keysched logged "dead-letter function or logger did not return"), and
// the row stayed in flight for ever: never marked, its slot taken.
func TestSinkErrorWhoseErrorMethodPanicsIsMarkedDead(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, 1, 1)
		died := make(chan outbox.DeadEvent, 1)
		r, stop := startRelay(t, ob, func(context.Context, outbox.Event) error {
			var e *derefError
			return e
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond), outbox.WithRetry(fastRetry),
			outbox.WithOnDead(func(d outbox.DeadEvent) { died <- d }))
		defer stop()
		select {
		case d := <-died:
			require.Equal(t, "<nil>", d.Err)
		case <-time.After(5 * time.Second):
			t.Fatalf("not marked dead: %+v, rows %v", r.Stats(), counts(t, ob))
		}
		require.Eventually(t, func() bool { return counts(t, ob)[outbox.Dead] == 1 }, 5*time.Second, 5*time.Millisecond)
	})
}
