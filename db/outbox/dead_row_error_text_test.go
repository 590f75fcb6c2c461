package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A row whose last error has a NUL byte or invalid UTF-8 (a sink quoting a
// binary response), or is cut at 4096 bytes inside a character, is marked
// dead with that error made storable text. PostgreSQL's TEXT refused it: the
// mark failed every time, the row stayed pending and was published again,
// with a fresh attempt budget, for ever (under Park the key never parked).
func TestRowWithAnUnstorableErrorIsMarkedDead(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		for name, c := range map[string]struct{ msg, stored string }{
			"NUL":           {"status 500: \x00\x01 body", "status 500: \uFFFD\x01 body"},
			"invalid UTF-8": {"status 500: \xff\xfe body", "status 500: \uFFFD body"},
			"cut rune":      {strings.Repeat("a", 4095) + "é and more", strings.Repeat("a", 4095)},
		} {
			t.Run(name, func(t *testing.T) {
				ob := newOutbox(t, db)
				writeEvents(t, ob, 1, 1, 1)
				died := make(chan outbox.DeadEvent, 1)
				r, stop := startRelay(t, ob, func(context.Context, outbox.Event) error {
					return keysched.Permanent(errors.New(c.msg))
				}, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond), outbox.WithRetry(fastRetry),
					outbox.WithOnDead(func(d outbox.DeadEvent) { died <- d }))
				var d outbox.DeadEvent
				select {
				case d = <-died:
				case <-time.After(5 * time.Second):
					t.Fatalf("not marked dead: %+v, rows %v", r.Stats(), counts(t, ob))
				}
				stop()
				require.Equal(t, c.stored, d.Err)
				require.True(t, utf8.ValidString(d.Err))
				dead, err := ob.Dead(context.Background(), 10)
				require.NoError(t, err)
				require.Len(t, dead, 1)
				require.Equal(t, d.Err, dead[0].Err, "the error stored is the one reported")
				require.Zero(t, r.Stats().DBErrors)
			})
		}
	})
}
