package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A WithOnDead function that panics does not strand the dead row's job: the
// row stays dead, the key's later rows are published, and the relay lets
// the key go.
func TestOnDeadPanicDoesNotStrandTheKey(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, 2, 2)
		var calls [2]atomic.Int32
		r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
			j, _ := strconv.Atoi(string(e.Payload))
			calls[j].Add(1)
			if j == 0 {
				return keysched.Permanent(errors.New("rejected"))
			}
			return nil
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond),
			outbox.WithOnDead(func(outbox.DeadEvent) { panic("on-dead panic") }))
		if err != nil {
			t.Fatal(err)
		}
		runRelay(t, r)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			c := counts(t, ob)
			if c[outbox.Dead] == 1 && c[outbox.Pending] == 0 && r.Stats().KeysHeld == 0 && r.Stats().InFlight == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("key stranded: calls %d, %d; stats %+v; counts %v", calls[0].Load(), calls[1].Load(), r.Stats(), c)
			}
		}
	})
}
