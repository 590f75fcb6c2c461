package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A relay whose only row in flight is a slow sink call, with nothing else to
// fetch, still finds a row written to another key soon: it must either poll
// again or tell writers to notify it (its idle row). The relay polls every
// hour. Exposed, not fixed: the relay that fetched the slow row is busy (it
// deleted its idle row, so writers do not notify it) and sleeps until that
// row settles or a poll interval has passed, so the other key's row waits
// for the slow call (here until the test ends; up to the sink timeout, or a
// poll interval, in general). Before the idle table every write notified.
func TestBusyRelayWithSlowRowFindsOtherKeysRow(t *testing.T) {
	db := dbtest.Postgres(t)
	ob := newOutbox(t, db)
	s := newClaimSink()
	started := make(chan struct{}, 1)
	unblock := make(chan struct{})
	defer close(unblock)
	r, _ := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
		if e.Key == "slow" {
			started <- struct{}{}
			select {
			case <-unblock:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return s.sink(ctx, e)
	}, outbox.WithLogger(quiet), outbox.WithPollInterval(time.Hour))
	waitUntil(t, "relay idle", func() bool { return outbox.Idle(r) })
	commitEvent(t, ob, "slow", "slow")
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the slow row never started")
	}
	time.Sleep(100 * time.Millisecond) // past the pace and the idle confirmation
	commitEvent(t, ob, "b", "b")
	s.wait(t, "b", 5*time.Second)
}
