package service

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/outbox"
)

// A replay whose write's COMMIT is cut short (here its context ends while
// the server runs the COMMIT: a deferred trigger on the replays' table
// sleeps in it; pgx drops the connection and sends a cancel request, which
// the trigger ignores, as a server that had got past the point of
// cancelling would, and the server commits)
// said "1 event not sent again", and the event was sent again. Its error now
// wraps outbox.ErrOutcomeUnknown and names the event as sent again or not;
// the new delivery that did commit is counted in the backlog until it is
// delivered. (An error before the COMMIT still says "not sent again": the
// transaction is rolled back, TestReplayThatFailsHalfwaySaysWhatItDid.)
func TestReplayWhoseCommitIsCutShortSaysOutcomeUnknown(t *testing.T) {
	open := postgresStore(t)
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusNoContent, "" })
	h := newHarnessOn(t, open, nil, func(c *Config) { c.Partners = map[string]string{"p": ep.srv.URL} })
	e0 := h.postDelivered("p", 1)[0]
	_, err := replayCutInCommit(t, h, e0, true)
	require.ErrorIs(t, err, outbox.ErrOutcomeUnknown)
	require.Contains(t, err.Error(), "1 event sent again or not (outcome unknown")
	require.Contains(t, err.Error(), e0)
	require.NotContains(t, err.Error(), "not sent again")

	// The server committed: e0 is sent again, and the backlog, which
	// counted its new delivery, ends at 0.
	require.Eventually(t, func() bool { ids, _ := ep.received(); return len(ids) == 2 }, waitLong, 5*time.Millisecond)
	require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond)
	require.Len(t, h.event(e0).Replays, 1)
}

// A replay whose COMMIT is cut short and that the server does not commit
// (the cancel request pgx sends reaches the COMMIT) is as unknown to the
// caller; its new delivery, counted in the backlog meanwhile, is looked for
// and, not found within Service.unknownReplayFor, leaves the backlog: the
// count returns to the database's.
func TestReplayCutShortAndNotCommittedLeavesTheBacklogAsItWas(t *testing.T) {
	open := postgresStore(t)
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusNoContent, "" })
	h := newHarnessOn(t, open, nil, func(c *Config) { c.Partners = map[string]string{"p": ep.srv.URL} })
	e0 := h.postDelivered("p", 1)[0]
	require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond)
	h.svc.unknownReplayFor = 300 * time.Millisecond
	_, err := replayCutInCommit(t, h, e0, false)
	require.ErrorIs(t, err, outbox.ErrOutcomeUnknown)
	require.Empty(t, h.event(e0).Replays, "not committed")
	require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, 10*time.Second, 5*time.Millisecond,
		"the uncommitted delivery leaves the backlog")
}

// replayCutInCommit replays id with a context that ends while the server
// runs the replay's COMMIT: a deferred trigger on the replays' table sleeps
// 1 s in it (ignoring the cancel request pgx sends when commit is set, so
// that the server commits; else the COMMIT is cancelled and rolled back).
func replayCutInCommit(t *testing.T, h *harness, id string, commit bool) (ReplayResult, error) {
	t.Helper()
	bg := context.Background()
	fn := h.store.replay + "_slow_commit"
	sleep := `PERFORM pg_sleep(1);`
	if commit {
		sleep = `BEGIN PERFORM pg_sleep(1); EXCEPTION WHEN query_canceled THEN NULL; END;`
	}
	for _, stmt := range []string{
		`CREATE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN ` + sleep + ` RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON ` + h.store.replay + ` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ` + fn + `()`,
	} {
		_, err := h.store.db.ExecContext(bg, stmt)
		require.NoError(t, err)
	}
	t.Cleanup(func() { _, _ = h.store.db.Exec(`DROP FUNCTION IF EXISTS ` + fn + `() CASCADE`) })

	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	inCommit := make(chan struct{})
	h.svc.beforeRequeue = func() {
		go func() {
			defer close(inCommit)
			defer cancel()
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				var n int
				if err := h.store.db.QueryRowContext(bg, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep' AND query ILIKE 'commit%'`).Scan(&n); err == nil && n > 0 {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			t.Error("the replay's COMMIT never ran")
		}()
	}
	res, err := h.svc.Replay(ctx, id)
	<-inCommit
	h.svc.beforeRequeue = nil
	return res, err
}
