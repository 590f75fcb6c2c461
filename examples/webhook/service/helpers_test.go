package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	announceOptOuts()
	// Every service, store, endpoint and browser a test starts is stopped:
	// nothing may outlive the tests. (ants starts a default pool when it is
	// imported: those goroutines exist before any test and are ignored.)
	goleak.VerifyTestMain(m, goleak.IgnoreCurrent(),
		// pgx's per-connection goroutines of a connection still closing
		// (as in db/internal/dbtest.LeakOptions); a *sql.DB left open would
		// still show as its connectionOpener.
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn/ctxwatch.(*ContextWatcher).Watch.func1"),
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn/internal/bgreader.(*BGReader).bgRead"))
}

// announceOptOuts prints one line to stderr per opt-out variable set, so
// that skipped tests show without -v: go test shows it when run in the
// package's directory with no package argument, with -v, and when the
// package fails (with package arguments, as in go test ./..., go test hides
// the output of a package that passes, this line too).
func announceOptOuts() {
	if os.Getenv(envSkipPostgres) == "1" {
		fmt.Fprintf(os.Stderr, "*** %s=1: the PostgreSQL tests of this package are skipped\n", envSkipPostgres)
	}
	if os.Getenv(envSkipBrowser) == "1" {
		fmt.Fprintf(os.Stderr, "*** %s=1: the browser tests of this package (operator page, event pages) are skipped\n", envSkipBrowser)
	}
}

// harness is a running service on a fresh SQLite file, its intake and admin
// handlers on loopback, and the simulated endpoints.
type harness struct {
	t      *testing.T
	svc    *Service
	store  *Store
	intake *httptest.Server
	admin  *httptest.Server
	rec    *sim.Recorder
	eps    map[string]*sim.Endpoint // partner -> endpoint

	mu       sync.Mutex
	accepted map[string][]string // partner -> IDs in acceptance order

	open func() (*Store, error) // the database: a fresh SQLite file unless set
}

// quick settings: short timeouts and backoffs so tests run in seconds.
func quickConfig() Config {
	return Config{
		MaxBacklog: 1000,
		Workers:    16,
		Limits:     DestinationLimits{Concurrency: 4, Rate: 10000, Burst: 1000},
		Breaker:    BreakerSettings{Failures: 5, OpenFor: 30 * time.Millisecond},
		Timeout:    time.Second,
		Retry:      keysched.RetryPolicy{MaxAttempts: 1000, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond},
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// newHarness starts endpoints with the given behaviours (partners sharing a
// behaviour name in shared share one endpoint) and the service.
func newHarness(t *testing.T, behaviors map[string]sim.Behavior, mod func(*Config)) *harness {
	t.Helper()
	path := filepath.Join(t.TempDir(), "webhook.db")
	return newHarnessOn(t, func() (*Store, error) { return OpenSQLite(t.Context(), path) }, behaviors, mod)
}

func newHarnessOn(t *testing.T, open func() (*Store, error), behaviors map[string]sim.Behavior, mod func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, rec: sim.NewRecorder(), eps: map[string]*sim.Endpoint{}, accepted: map[string][]string{}, open: open}
	cfg := quickConfig()
	cfg.Partners = map[string]string{}
	cfg.Secrets = map[string][]string{}
	for p, b := range behaviors {
		e, err := sim.NewEndpoint(h.rec, b)
		require.NoError(t, err)
		h.eps[p] = e
		cfg.Partners[p] = e.URL
	}
	if mod != nil {
		mod(&cfg)
	}
	// Every partner signs with a fresh secret its endpoint accepts, unless
	// the test gave one.
	for p := range cfg.Partners {
		if cfg.Secrets[p] == nil {
			sec, err := h.rec.NewSecret(p)
			require.NoError(t, err)
			cfg.Secrets[p] = []string{sec}
		}
	}
	h.start(cfg)
	t.Cleanup(func() {
		h.stop()
		for _, e := range h.eps {
			_ = e.Close()
		}
	})
	return h
}

func (h *harness) start(cfg Config) {
	t := h.t
	st, err := h.open()
	require.NoError(t, err)
	cfg.Store = st
	svc, err := New(t.Context(), cfg)
	if err != nil {
		_ = st.Close()
		require.NoError(t, err)
	}
	h.svc, h.store = svc, st
	h.intake = httptest.NewServer(svc.IntakeHandler())
	h.admin = httptest.NewServer(svc.AdminHandler())
}

func (h *harness) stop() {
	if h.svc == nil {
		return
	}
	h.intake.Close()
	h.admin.Close()
	// Deliveries in flight get a moment, then are cancelled (their rows
	// stay pending): a hanging endpoint's call ends with ctx.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := h.svc.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		require.NoError(h.t, err)
	}
	require.NoError(h.t, h.store.Close())
	h.svc = nil
}

// post sends one event; it returns the status code and, for a 202, the ID
// (recorded as accepted for the partner).
func (h *harness) post(partner string, seq int) (int, string) {
	h.t.Helper()
	body := fmt.Sprintf(`{"type":"test.event","data":{"seq":%d}}`, seq)
	resp, err := http.Post(h.intake.URL+"/events/"+partner, "application/json", bytes.NewBufferString(body))
	require.NoError(h.t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, ""
	}
	var r IntakeResponse
	require.NoError(h.t, json.NewDecoder(resp.Body).Decode(&r))
	require.NotEmpty(h.t, r.ID)
	h.mu.Lock()
	h.accepted[partner] = append(h.accepted[partner], r.ID)
	h.mu.Unlock()
	return resp.StatusCode, r.ID
}

// postDelivered posts events 0..n-1 to partner and waits until each is on
// record as delivered; it returns their IDs.
func (h *harness) postDelivered(partner string, n int) []string {
	h.t.Helper()
	ids := make([]string, n)
	for i := range ids {
		_, ids[i] = h.post(partner, i)
	}
	require.Eventually(h.t, func() bool {
		for _, id := range ids {
			if h.event(id).State != StateDelivered {
				return false
			}
		}
		return true
	}, waitLong, 5*time.Millisecond)
	return ids
}

func (h *harness) acceptedIDs(partner string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.accepted[partner]...)
}

// delivered reports whether every accepted event of partner reached its
// endpoint at least once.
func (h *harness) delivered(partner string) bool {
	got := map[string]bool{}
	for _, id := range h.rec.IDs(partner) {
		got[id] = true
	}
	for _, id := range h.acceptedIDs(partner) {
		if !got[id] {
			return false
		}
	}
	return true
}

func (h *harness) status(partner string) PartnerStatus {
	for _, s := range h.statuses() {
		if s.Partner == partner {
			return s
		}
	}
	h.t.Fatalf("no partner %q", partner)
	return PartnerStatus{}
}

// checkOrder asserts per-partner order at the endpoint: every accepted event
// arrived, first arrivals in acceptance order; duplicates are allowed.
func (h *harness) checkOrder(partner string) int {
	h.t.Helper()
	dups, err := sim.CheckOrder(h.acceptedIDs(partner), h.rec.IDs(partner))
	require.NoError(h.t, err, "partner %s", partner)
	return dups
}

const waitLong = 30 * time.Second

// head returns the parked partner's head (PartnerStatus.Head: what Skip
// takes), "" when it is not parked.
func (h *harness) head(partner string) string { return h.status(partner).Head }

func (h *harness) parked() []string {
	p, err := h.svc.Parked(context.Background())
	require.NoError(h.t, err)
	return p
}

func (h *harness) statuses() []PartnerStatus {
	s, err := h.svc.Status(context.Background())
	require.NoError(h.t, err)
	return s
}
