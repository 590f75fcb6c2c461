package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keysched/keysched/db/sqldb"
	"github.com/keysched/keysched/examples/webhook/service"
	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
)

// The PostgreSQL server the db module's tests use (see service/postgres_test.go).
const (
	defaultPostgresDSN = "host=/var/run/postgresql dbname=keysched_test"
	envPostgresDSN     = "KEYSCHED_TEST_POSTGRES"
	envSkipPostgres    = "KEYSCHED_SKIP_POSTGRES"
)

// freshDatabase creates a database of the test's own on the test server
// (dropped, WITH (FORCE), when t ends) and returns its DSN; without a server
// it fails t, saying so, unless KEYSCHED_SKIP_POSTGRES=1 (then it skips).
func freshDatabase(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv(envPostgresDSN)
	if dsn == "" {
		dsn = defaultPostgresDSN
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	admin, err := sqldb.OpenPostgres(ctx, dsn)
	if err != nil {
		msg := fmt.Sprintf("\n*** POSTGRESQL NOT AVAILABLE: %v\n*** DSN %q (set %s). The several-instances test did NOT run.\n", err, dsn, envPostgresDSN)
		if os.Getenv(envSkipPostgres) == "1" {
			t.Skip(msg)
		}
		t.Fatal(msg + "*** Set it up as README.md says, or skip the PostgreSQL tests: " + envSkipPostgres + "=1\n")
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "webhook_instances_" + hex.EncodeToString(b)
	_, err = admin.ExecContext(ctx, `CREATE DATABASE `+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := admin.ExecContext(ctx, `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`)
		if err != nil {
			t.Errorf("dropping the test database %s: %v", name, err)
		}
		_ = admin.Close()
	})
	// The same server and credentials, the new database: a key=value DSN
	// takes its last dbname.
	if strings.Contains(dsn, "://") {
		t.Skipf("%s is a URL; this test needs a key=value DSN to name its own database", envPostgresDSN)
	}
	return dsn + " dbname=" + name
}

// Two and three service processes (the binary) on one PostgreSQL database
// of the test's own, distinct -relay-name each, partners posting to any of
// them, checked from the partners' side:
//
//   - the backlog bound holds across instances as the README says: with a
//     partner's endpoint hanging, a flood spread over the instances admits
//     between MaxBacklog and n × MaxBacklog events, then every instance
//     answers 429; once the events are delivered (by whichever instance
//     holds the partner), every instance admits again (before the backlog
//     sync, an instance never heard of the deliveries another made and
//     answered 429 for ever);
//   - per-partner order: every accepted event arrives, first arrivals in
//     the order of the 202s, whichever instance accepted them;
//   - no partner is ever called by two instances at once (the endpoints
//     count requests that begin while one for the same partner is in
//     flight);
//   - one instance is killed (SIGKILL) mid-delivery while holding partner
//     leases: its partners are taken over by the others once the lease
//     (2 s) expires, and everything arrives.
func TestSeveralInstancesShareOnePostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the service binary")
	}
	freshDatabase(t) // skip early without a server
	bin := buildService(t)
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d instances", n), func(t *testing.T) { runInstances(t, bin, freshDatabase(t), n) })
	}
}

func runInstances(t *testing.T, bin, dsn string, n int) {
	rec := sim.NewRecorder()
	partners := []string{"a", "b", "c", "d", "e"}
	var eps []string
	var secrets strings.Builder
	addPartner := func(p string, b sim.Behavior) *sim.Endpoint {
		e, err := sim.NewEndpoint(rec, b)
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Close() })
		eps = append(eps, p+"="+e.URL)
		sec, err := rec.NewSecret(p)
		require.NoError(t, err)
		fmt.Fprintf(&secrets, "%s %s\n", p, sec)
		return e
	}
	for _, p := range partners {
		addPartner(p, sim.Behavior{Delay: 100 * time.Millisecond}) // 3 s for a partner's 30 events
	}
	flood := addPartner("flood", sim.Behavior{Hang: true})
	const bound = 30
	secretsFile := writeSecrets(t, secrets.String())
	procs := make([]*process, n)
	for i := range n {
		procs[i] = startService(t, bin, "-postgres", dsn, "-intake", "127.0.0.1:0", "-admin", "127.0.0.1:0",
			"-endpoints", strings.Join(eps, ","), "-secrets-file", secretsFile, "-sim-rate", "0",
			"-relay-name", fmt.Sprintf("webhook-%d", i), "-lease", "3s", "-timeout", "500ms",
			"-max-backlog", fmt.Sprint(bound), "-backlog-sync", "200ms",
			"-attempts", "1000", "-backoff", "5ms", "-breaker-open", "100ms", "-log", "warn")
		p := procs[i]
		t.Cleanup(func() {
			select {
			case <-p.exited:
			default:
				p.kill(t)
			}
		})
	}
	post := func(to *process, partner string, seq int) (int, string) {
		body := fmt.Sprintf(`{"type":"instances.test","data":{"seq":%d}}`, seq)
		resp, err := http.Post(to.intake+"/events/"+partner, "application/json", bytes.NewBufferString(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var r struct{ ID string }
		if resp.StatusCode == http.StatusAccepted {
			require.NoError(t, json.Unmarshal(b, &r))
		}
		return resp.StatusCode, r.ID
	}

	// The bound across instances.
	var admitted, rejected int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 3 * bound {
		wg.Go(func() {
			code, _ := post(procs[i%n], "flood", i)
			mu.Lock()
			defer mu.Unlock()
			switch code {
			case http.StatusAccepted:
				admitted++
			case http.StatusTooManyRequests:
				rejected++
			default:
				t.Errorf("flood: %d", code)
			}
		})
	}
	wg.Wait()
	t.Logf("flood: %d admitted, %d refused (bound %d per partner, %d instances)", admitted, rejected, bound, n)
	require.GreaterOrEqual(t, admitted, bound)
	require.LessOrEqual(t, admitted, n*bound, "beyond n × MaxBacklog")
	time.Sleep(500 * time.Millisecond) // two syncs
	for i, p := range procs {
		code, _ := post(p, "flood", 1000+i)
		require.Equal(t, http.StatusTooManyRequests, code, "instance %d admits beyond the bound", i)
	}
	flood.Set(sim.Behavior{})
	require.Eventually(t, func() bool { return len(rec.IDs("flood")) >= admitted }, 60*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		for i := range procs {
			if code, _ := post(procs[i], "flood", 2000+i); code != http.StatusAccepted {
				return false
			}
		}
		return true
	}, 10*time.Second, 100*time.Millisecond, "an instance still refuses a drained partner: it never heard of the deliveries another made")

	// Order, one call at a time per partner, and a takeover.
	leaseDB, err := sqldb.OpenPostgres(t.Context(), dsn)
	require.NoError(t, err)
	defer leaseDB.Close()
	const perPartner = 30
	accepted := map[string][]string{}
	for _, partner := range partners {
		wg.Go(func() { // one sender per partner, round robin over the instances
			for i := range perPartner {
				code, id := post(procs[i%n], partner, i)
				if code != http.StatusAccepted {
					t.Errorf("post %s %d: %d", partner, i, code)
					return
				}
				mu.Lock()
				accepted[partner] = append(accepted[partner], id)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	firstArrivals := func() int {
		n := 0
		for _, p := range partners {
			seen := map[string]bool{}
			for _, id := range rec.IDs(p) {
				seen[id] = true
			}
			n += len(seen)
		}
		return n
	}
	total := perPartner * len(partners)
	require.Eventually(t, func() bool { return firstArrivals() >= total/5 }, 60*time.Second, time.Millisecond)
	// The victim: the instance holding the most partner leases now.
	victim, held := 0, -1
	for i, h := range leasesHeld(t, leaseDB, n) {
		if h > held {
			victim, held = i, h
		}
	}
	require.Positive(t, held, "no instance holds a lease mid-delivery")
	procs[victim].kill(t)
	killed := time.Now()
	atKill := firstArrivals()
	t.Logf("killed instance %d holding %d partner leases, with %d of %d events delivered", victim, held, atKill, total)
	require.Less(t, atKill, total, "the kill came after every delivery: the test proved nothing")
	require.Eventually(t, func() bool { return firstArrivals() == total }, 60*time.Second, 5*time.Millisecond)
	t.Logf("the rest delivered %v after the kill (lease 3 s)", time.Since(killed).Round(10*time.Millisecond))
	dups := 0
	for _, p := range partners {
		d, err := sim.CheckOrder(accepted[p], rec.IDs(p))
		require.NoError(t, err, "partner %s", p)
		dups += d
	}
	for _, p := range append(partners, "flood") {
		require.Zero(t, rec.Overlaps(p), "partner %s was called by two instances at once", p)
	}
	bad, last := rec.BadSignatures()
	require.Zero(t, bad, "the last: %s", last)
	t.Logf("%d events in order per partner over %d instances, %d duplicates, no partner called twice at once", total, n, dups)
}

// leasesHeld returns how many unexpired partner leases each instance
// (relay "webhook-<i>") holds.
func leasesHeld(t *testing.T, db *sql.DB, n int) []int {
	t.Helper()
	out := make([]int, n)
	rows, err := db.QueryContext(t.Context(), `SELECT owner, COUNT(*) FROM `+service.OutboxTable+`_lease WHERE expires_at > now() GROUP BY owner`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var owner string
		var c int
		require.NoError(t, rows.Scan(&owner, &c))
		var i int
		if _, err := fmt.Sscanf(owner, "webhook-%d", &i); err == nil && i < n {
			out[i] = c
		}
	}
	require.NoError(t, rows.Err())
	return out
}
