package outbox_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A relay whose first fetch of a key comes later than a lease after its
// claim (a slow database, a loaded machine: here each poll waits 1.5 leases
// between claiming and fetching, while the renewer keeps the leases alive)
// still publishes. A tenure used to drain a lease after its claim, whether
// or not it had fetched anything: such a relay released every key it
// claimed before its first fetch, claimed it again and released it again,
// for ever (0 of 5 events in 10 s); draining now counts from the tenure's
// first row.
func TestSlowFirstFetchStillPublishes(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		writeEvents(t, ob, 1, 5, 5)
		rec := newRecorder(5)
		const lease = 300 * time.Millisecond
		r, err := ob.NewRelay(rec.sink, outbox.WithLogger(quiet), outbox.WithOwner("slow"),
			outbox.WithPollInterval(5*time.Millisecond), outbox.WithLeaseDuration(lease))
		require.NoError(t, err)
		outbox.DelayFetch(r, lease*3/2)
		stop := runRelay(t, r)
		rec.wait(t, 10*time.Second)
		stop()
		rec.check(t, 1, 5) // in order, all of them
		require.Empty(t, counts(t, ob))
	})
}
