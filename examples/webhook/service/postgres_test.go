package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/sqldb"
	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
)

// The PostgreSQL server and variables the db module's tests use.
const (
	defaultPostgresDSN = "host=/var/run/postgresql dbname=keysched_test"
	envPostgresDSN     = "KEYSCHED_TEST_POSTGRES"
	envSkipPostgres    = "KEYSCHED_SKIP_POSTGRES"
)

var pgSeq atomic.Int64

// postgresStore returns an opener of a Store on the test server, with
// tables of its own (dropped when t ends). It skips t when
// KEYSCHED_SKIP_POSTGRES=1, and fails it, saying how to start the server or
// opt out, when no server answers.
func postgresStore(t *testing.T) func() (*Store, error) {
	t.Helper()
	if os.Getenv(envSkipPostgres) == "1" {
		t.Skipf("%s=1: PostgreSQL tests skipped", envSkipPostgres)
	}
	dsn := os.Getenv(envPostgresDSN)
	if dsn == "" {
		dsn = defaultPostgresDSN
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	db, err := sqldb.OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatalf("\n*** POSTGRESQL NOT AVAILABLE: %v\n*** DSN %q (set %s). The webhook service's PostgreSQL test cannot run.\n"+
			"*** Start it (Debian, as root): pg_ctlcluster 15 main start; runuser -u postgres -- createuser --superuser \"$(id -un)\"; runuser -u postgres -- createdb -O \"$(id -un)\" keysched_test\n"+
			"*** Or skip the PostgreSQL tests: %s=1\n", err, dsn, envPostgresDSN, envSkipPostgres)
	}
	prefix := fmt.Sprintf("webhook_t%d_%d_", os.Getpid(), pgSeq.Add(1))
	t.Cleanup(func() {
		for _, tbl := range []string{"outbox", "outbox_lease", "intake", "attempt", "replay"} {
			_, _ = db.Exec(`DROP TABLE IF EXISTS ` + prefix + tbl)
		}
		_, _ = db.Exec(`DROP FUNCTION IF EXISTS ` + prefix + `outbox_notify() CASCADE`)
		db.Close()
	})
	return func() (*Store, error) { return NewStore(t.Context(), db, WithTablePrefix(prefix)) }
}

// The same service on PostgreSQL: order through a flaky endpoint, a park,
// Resume, and a restart that delivers what the last process left.
func TestPostgresParkResumeRestart(t *testing.T) {
	open := postgresStore(t)
	h := newHarnessOn(t, open, map[string]sim.Behavior{"flaky": {FailRate: 0.3}, "down": {Down: true}}, func(c *Config) {
		c.Retry = keysched.RetryPolicy{MaxAttempts: 4, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
		c.Breaker = BreakerSettings{Failures: 1000, OpenFor: time.Millisecond}
	})
	for i := range 20 {
		h.post("flaky", i)
		h.post("down", i)
	}
	require.Eventually(t, func() bool { return slices.Contains(h.parked(), "down") }, waitLong, 5*time.Millisecond)
	cfg := h.svc.cfg
	h.stop()
	h.eps["down"].Set(sim.Behavior{})
	cfg.Store = nil
	h.start(cfg) // same tables, a new process's worth of state
	require.Contains(t, h.parked(), "down", "a park outlives the process")
	require.Equal(t, 20, h.status("down").Backlog)
	require.NoError(t, h.svc.Resume(t.Context(), "down"))
	for _, p := range []string{"flaky", "down"} {
		require.Eventually(t, func() bool {
			// 4 attempts at 30% failure park "flaky" now and then: an
			// operator's job, done here.
			if slices.Contains(h.parked(), p) {
				if err := h.svc.Resume(t.Context(), p); err != nil && !errors.Is(err, ErrNotParked) {
					t.Error(err)
				}
			}
			return h.delivered(p)
		}, waitLong, 5*time.Millisecond, p)
		h.checkOrder(p)
	}
}
