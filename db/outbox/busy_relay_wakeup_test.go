package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A relay whose only row in flight is a slow sink call, with nothing else to
// fetch, still finds a row written to another key soon: it polls again within
// idleConfirm of the poll that found rows, and that poll, finding nothing,
// makes it idle, so that writers notify it. The relay polls every hour.
// Without the look within idleConfirm, the relay (busy: it deleted its idle
// row when it fetched, so writers did not notify it) slept until the slow
// row settled or a poll interval passed, and the other key's row waited
// (here until the test's end). Found 2026-12-01 by an attack on the linger.
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
