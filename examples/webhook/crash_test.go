package main

import (
	"bufio"
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keysched/keysched/db/sqldb"
	"github.com/keysched/keysched/examples/webhook/service"
	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
)

// process is the service binary running as a real process.
type process struct {
	cmd           *exec.Cmd
	intake, admin string
	stderr        *syncBuffer
	exited        chan struct{}
}

// The service binary, built once per test run (go build into a temporary
// directory, removed by TestMain) and shared by the tests that start it.
var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
)

func TestMain(m *testing.M) {
	if os.Getenv(envSkipPostgres) == "1" {
		// Shows without -v (see service's announceOptOuts for when go test shows it).
		fmt.Fprintf(os.Stderr, "*** %s=1: the PostgreSQL tests of this package (several instances) are skipped\n", envSkipPostgres)
	}
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func buildService(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if buildDir, buildErr = os.MkdirTemp("", "webhook-test-bin-"); buildErr != nil {
			return
		}
		buildBin = filepath.Join(buildDir, "webhook")
		args := []string{"build", "-o", buildBin}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %w: %s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return buildBin
}

func startService(t *testing.T, bin string, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(bin, args...), stderr: &syncBuffer{}, exited: make(chan struct{})}
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	p.cmd.Stderr = p.stderr
	require.NoError(t, p.cmd.Start())
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		found := false
		for sc.Scan() {
			line := sc.Text()
			if !found && strings.HasPrefix(line, "READY ") {
				for _, f := range strings.Fields(line)[1:] {
					k, v, _ := strings.Cut(f, "=")
					switch k {
					case "intake":
						p.intake = v
					case "admin":
						p.admin = v
					}
				}
				found = true
				ready <- nil
			}
		}
		if !found {
			ready <- fmt.Errorf("the service exited before READY")
		}
	}()
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	select {
	case err := <-ready:
		require.NoError(t, err, "stderr: %s", p.stderr)
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		t.Fatalf("the service did not print READY within 60 s")
	}
	return p
}

func (p *process) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Kill()) // SIGKILL on Unix: no shutdown code runs
	<-p.exited
}

// The service is killed (SIGKILL) while it delivers, and restarted on the
// same database file under the same -relay-name, with the default lease
// (30 s): every accepted event arrives at least once, in order per partner,
// and all of them before the dead process's leases would have expired (the
// restarted relay takes its own leases back at once; a relay that waited
// for them to expire would fail that check).
func TestCrashDuringDeliveryLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the service binary")
	}
	bin := buildService(t)
	rec := sim.NewRecorder()
	behaviors := map[string]sim.Behavior{
		"a": {Delay: 50 * time.Millisecond}, // 3 s for its 60 events, whatever the CPU
		"b": {Delay: 2 * time.Millisecond, FailRate: 0.3},
		"c": {Delay: 5 * time.Millisecond},
		"d": {Delay: 40 * time.Millisecond},
	}
	var eps []string
	var secrets strings.Builder
	for p, b := range behaviors {
		e, err := sim.NewEndpoint(rec, b)
		require.NoError(t, err)
		defer e.Close()
		eps = append(eps, p+"="+e.URL)
		sec, err := rec.NewSecret(p)
		require.NoError(t, err)
		fmt.Fprintf(&secrets, "%s %s\n", p, sec)
	}
	db := filepath.Join(t.TempDir(), "webhook.db")
	args := []string{"-db", db, "-intake", "127.0.0.1:0", "-admin", "127.0.0.1:0",
		"-endpoints", strings.Join(eps, ","), "-secrets-file", writeSecrets(t, secrets.String()), "-sim-rate", "0",
		"-timeout", "500ms", "-relay-name", "webhook-1", "-breaker-open", "100ms", "-attempts", "1000", "-backoff", "5ms", "-log", "warn"}

	p := startService(t, bin, args...)
	t0 := time.Now()
	const perPartner = 60
	accepted := map[string][]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for partner := range behaviors {
		wg.Go(func() { // one sender per partner: its events have an order
			for i := range perPartner {
				body := fmt.Sprintf(`{"type":"crash.test","data":{"seq":%d}}`, i)
				resp, err := http.Post(p.intake+"/events/"+partner, "application/json", bytes.NewBufferString(body))
				if err != nil {
					t.Errorf("post: %v", err)
					return
				}
				var r struct{ ID string }
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted || json.Unmarshal(b, &r) != nil {
					t.Errorf("post: %d %s", resp.StatusCode, b)
					return
				}
				mu.Lock()
				accepted[partner] = append(accepted[partner], r.ID)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("posted in %v", time.Since(t0))
	total := perPartner * len(behaviors)
	firstArrivals := func() int {
		n := 0
		for partner := range behaviors {
			seen := map[string]bool{}
			for _, id := range rec.IDs(partner) {
				seen[id] = true
			}
			n += len(seen)
		}
		return n
	}
	// Kill it mid-delivery.
	require.Eventually(t, func() bool { return firstArrivals() >= total/4 }, 60*time.Second, time.Millisecond)
	p.kill(t)
	atKill := firstArrivals()
	t.Logf("killed with %d of %d events delivered", atKill, total)
	require.Less(t, atKill, total, "the kill came after every delivery: the test proved nothing")
	expiry := leaseExpiry(t, db, "webhook-1")

	p = startService(t, bin, args...)
	defer p.kill(t)
	t1 := time.Now()
	require.Eventually(t, func() bool { return firstArrivals() == total }, 60*time.Second, 5*time.Millisecond,
		"stderr of the restarted service: %s", p.stderr)
	done := time.Now()
	t.Logf("restarted and delivered the rest in %v; the dead process's first lease would have expired %v later",
		done.Sub(t1), expiry.Sub(done))
	require.True(t, done.Before(expiry),
		"the rest was delivered only after the dead process's leases expired (%v): the restarted relay did not take them back", expiry)
	dups := 0
	for partner := range behaviors {
		d, err := sim.CheckOrder(accepted[partner], rec.IDs(partner))
		require.NoError(t, err, "partner %s", partner)
		dups += d
	}
	t.Logf("all %d events delivered in order per partner after the crash; %d duplicates", total, dups)
	bad, last := rec.BadSignatures()
	require.Zero(t, bad, "requests whose signature did not verify; the last: %s", last)
}

// leaseExpiry returns the earliest expiry of the partner leases owner holds
// in the service's SQLite file (the killed process's, read before the
// restart). No lease at all fails the test: the kill came when the relay
// held nothing, and the restart proved nothing about leases.
func leaseExpiry(t *testing.T, path, owner string) time.Time {
	t.Helper()
	db, err := sqldb.OpenSQLite(path)
	require.NoError(t, err)
	defer db.Close()
	var n int
	var micros sql.NullInt64
	require.NoError(t, db.QueryRow(`SELECT COUNT(*), MIN(expires_at) FROM `+service.OutboxTable+`_lease WHERE owner = ?`, owner).Scan(&n, &micros))
	require.Positive(t, n, "the killed relay held no lease")
	t.Logf("the killed relay held %d partner leases", n)
	return time.UnixMicro(micros.Int64)
}

// writeSecrets writes a -secrets-file (mode 0600) and returns its path.
func writeSecrets(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secrets")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	return path
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
