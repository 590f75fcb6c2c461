// Command webhook runs the webhook delivery service with an embedded SQLite
// database and, by default, a built-in simulation: a set of partners whose
// customer endpoints (on loopback) are fast, slow, flaky, hanging or down
// for a while, and a producer posting events to the intake.
//
//	go run ./examples/webhook                # simulation, database in a temp dir
//	go run ./examples/webhook -db hooks.db   # keep the database
//	go run ./examples/webhook -endpoints 'acme=http://127.0.0.1:9000/hook,globex=...' -sim-rate 0
//	go run ./examples/webhook -postgres 'postgres://user@localhost/webhook'
//
// It prints where to look: the intake URL, the operator page and /metrics.
// Stop it with Ctrl-C (SIGINT or SIGTERM): undelivered events stay in the
// database and are delivered by the next start.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/service"
	"github.com/keysched/keysched/examples/webhook/signing"
	"github.com/keysched/keysched/examples/webhook/sim"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, errorLine(err))
		os.Exit(1)
	}
}

// errorLine is the line main prints for run's error: prefixed with
// "webhook: " once (the service's errors carry it already).
func errorLine(err error) string {
	msg := err.Error()
	if !strings.HasPrefix(msg, "webhook: ") {
		msg = "webhook: " + msg
	}
	return msg
}

type options struct {
	intake, admin string
	dbPath        string
	tempDB        bool // no -db: the database is in a temporary directory, removed at exit
	postgres      string
	endpoints     string
	secretsFile   string
	adminToken    string
	maxRetryAfter time.Duration
	backlogSync   time.Duration
	partners      int
	simRate       float64
	maxBacklog    int
	workers       int
	attempts      int
	backoff       time.Duration
	timeout       time.Duration
	concurrency   int
	rate          float64
	logLevel      string
	level         slog.Level // -log parsed
	lease         time.Duration
	relayName     string
	brkFailures   uint
	brkOpen       time.Duration
	history       time.Duration
	skipUnconf    bool
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("webhook", flag.ContinueOnError)
	fs.StringVar(&o.intake, "intake", "127.0.0.1:8080", "intake listen address (partners POST /events/{partner}); :0 picks a port")
	fs.StringVar(&o.admin, "admin", "127.0.0.1:8081", "operator page and /metrics listen address; :0 picks a port")
	fs.StringVar(&o.dbPath, "db", "", "SQLite database file (default: a new file in a temporary directory)")
	fs.StringVar(&o.postgres, "postgres", "", "PostgreSQL URL; replaces SQLite")
	fs.StringVar(&o.endpoints, "endpoints", "", "partner=URL,... : real endpoints instead of the simulated ones")
	fs.StringVar(&o.secretsFile, "secrets-file", "", "file of signing secrets, one line per partner: 'partner whsec_... [whsec_...]' (current first; during a rotation the old one too, all sign); required with -endpoints, a line for each of its partners (lines of other partners are ignored, with a warning); the simulation makes its own")
	// No flag default from the environment: the usage (-h, or any
	// refused flag) prints a flag's default, and showed the token.
	fs.StringVar(&o.adminToken, "admin-token", "", "bearer token the admin address requires (operator page, actions, /metrics; browsers: Basic auth, token as password); default $WEBHOOK_ADMIN_TOKEN (prefer it: a flag shows in ps). Required unless -admin is a loopback address")
	fs.DurationVar(&o.maxRetryAfter, "max-retry-after", service.DefaultMaxRetryAfter, "cap on the wait a partner's 429/503 Retry-After asks for")
	fs.DurationVar(&o.backlogSync, "backlog-sync", 0, "how often each instance re-reads the partners' undelivered events from the database (needed with several instances on one -postgres database; above 0); not given: 1s with -postgres, never with SQLite")
	fs.IntVar(&o.partners, "partners", 12, "number of simulated partners (without -endpoints)")
	fs.Float64Var(&o.simRate, "sim-rate", 20, "events per second the built-in producer posts (0: none)")
	fs.IntVar(&o.maxBacklog, "max-backlog", 10000, "undelivered events per partner before intake answers 429")
	fs.IntVar(&o.workers, "workers", 64, "bounded pool for all outbound calls")
	fs.IntVar(&o.attempts, "attempts", 6, "delivery attempts per event before its partner is parked")
	fs.DurationVar(&o.backoff, "backoff", 200*time.Millisecond, "backoff ceiling before the second attempt (doubles, full jitter, capped at 30s)")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Second, "timeout of each HTTP delivery")
	fs.IntVar(&o.concurrency, "dest-concurrency", 8, "calls in flight per destination (bulkhead)")
	fs.Float64Var(&o.rate, "dest-rate", 200, "calls per second per destination (token bucket)")
	fs.StringVar(&o.logLevel, "log", "info", "log level: debug, info, warn, error")
	fs.UintVar(&o.brkFailures, "breaker-failures", 5, "consecutive failed calls that open a destination's circuit breaker")
	fs.DurationVar(&o.brkOpen, "breaker-open", 10*time.Second, "how long an open breaker refuses calls before trying one")
	fs.StringVar(&o.relayName, "relay-name", "webhook", "this instance's name in the relay's lease table: the same across restarts (a restart takes its partners back at once), distinct per instance sharing a -postgres database")
	fs.DurationVar(&o.lease, "lease", 30*time.Second, "relay lease per partner: after a crash, how long before a new process takes a partner over; at least twice -timeout plus a second; not given: 30s, or 3 × -timeout when that is more")
	fs.DurationVar(&o.history, "history", 7*24*time.Hour, "how long each event's attempts and delivered payload are kept (lookup, replay); at least 1m")
	fs.BoolVar(&o.skipUnconf, "skip-unconfigured", false, "mark skipped (kept, not delivered, logged) the undelivered events of partners no longer configured; without it such events refuse the start, naming each partner and its count")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["admin-token"] {
		o.adminToken = os.Getenv("WEBHOOK_ADMIN_TOKEN")
	}
	// -backlog-sync given is a period: 0 (or below) is refused like every
	// duration flag (with several instances, never syncing made each one
	// answer 429 for ever); not given, it is 1s with -postgres, never
	// with SQLite (one process per SQLite file).
	if set["backlog-sync"] && o.backlogSync <= 0 {
		return o, fmt.Errorf("-backlog-sync %v: need above 0 (omit it for the default: 1s with -postgres, never with SQLite)", o.backlogSync)
	}
	if err := o.level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return o, fmt.Errorf("-log %q: need debug, info, warn or error", o.logLevel)
	}
	if !set["backlog-sync"] && o.postgres != "" {
		o.backlogSync = time.Second
	}
	// -lease not given follows -timeout, as Config.LeaseDuration's
	// default does: -timeout 20s alone was refused for a -lease never
	// given.
	if !set["lease"] && o.timeout > o.lease/3 && o.timeout <= math.MaxInt64/3 {
		o.lease = 3 * o.timeout
	}
	// Checked here, not left to what they feed: -sim-rate 1e10 (or +Inf)
	// made the producer's ticker interval 0, and NewTicker panicked in its
	// goroutine, killing the service; -dest-rate +Inf made the burst an
	// out-of-range float-to-int conversion.
	// Each of these fed a Config field whose zero means "the default": 0
	// (or '') was accepted and silently replaced (-timeout 0 became
	// Config.Timeout's 10 s, not this flag's 5 s). Refused, naming the
	// flag, like -partners 0, -dest-concurrency 0 and -attempts 0.
	switch {
	case o.workers < 1:
		return o, fmt.Errorf("-workers %d: need at least 1", o.workers)
	case o.timeout <= 0:
		return o, fmt.Errorf("-timeout %v: need above 0", o.timeout)
	case o.maxBacklog < 1:
		return o, fmt.Errorf("-max-backlog %d: need at least 1", o.maxBacklog)
	case o.relayName == "":
		return o, errors.New("-relay-name '': need a name (this instance's name in the lease table)")
	case o.attempts < 1:
		return o, fmt.Errorf("-attempts %d: need at least 1", o.attempts)
	case o.concurrency < 1:
		return o, fmt.Errorf("-dest-concurrency %d: need at least 1", o.concurrency)
	case o.lease < 2*(o.timeout+time.Second):
		return o, fmt.Errorf("-lease %v: need at least twice -timeout plus a second (%v with -timeout %v): a delivery's context ends with its partner's lease", o.lease, 2*(o.timeout+time.Second), o.timeout)
	case o.backoff <= 0:
		return o, fmt.Errorf("-backoff %v: need above 0 (the backoff ceiling before the second attempt)", o.backoff)
	case o.adminToken != "" && len(o.adminToken) < service.MinAdminTokenBytes:
		return o, fmt.Errorf("-admin-token (or $WEBHOOK_ADMIN_TOKEN) of %d bytes: need at least %d (e.g. openssl rand -hex 16), or none with a loopback -admin", len(o.adminToken), service.MinAdminTokenBytes)
	case o.maxRetryAfter <= 0:
		return o, fmt.Errorf("-max-retry-after %v: need above 0", o.maxRetryAfter)
	case o.brkFailures < 1:
		return o, fmt.Errorf("-breaker-failures %d: need at least 1", o.brkFailures)
	case o.brkOpen <= 0:
		return o, fmt.Errorf("-breaker-open %v: need above 0", o.brkOpen)
	}
	switch {
	case !(o.simRate >= 0 && o.simRate <= maxSimRate):
		return o, fmt.Errorf("-sim-rate %v: need 0 to %v events per second", o.simRate, maxSimRate)
	case !(o.rate > 0 && o.rate <= maxDestRate):
		return o, fmt.Errorf("-dest-rate %v: need above 0, at most %v calls per second", o.rate, maxDestRate)
	case o.history < time.Minute:
		return o, fmt.Errorf("-history %v: need at least 1m", o.history)
	case o.endpoints == "" && (o.partners < 1 || o.partners > maxSimPartners):
		return o, fmt.Errorf("-partners %d: need 1 to %d", o.partners, maxSimPartners)
	case o.adminToken == "" && !loopbackOnly(o.admin):
		return o, fmt.Errorf("-admin %s is reachable beyond this machine: set -admin-token or $WEBHOOK_ADMIN_TOKEN (anyone reaching it could skip a partner's events)", o.admin)
	case o.endpoints != "" && o.secretsFile == "":
		return o, errors.New("-endpoints needs -secrets-file: every partner's requests are signed (Standard Webhooks)")
	}
	return o, nil
}

// Bounds of the flags that feed arithmetic.
const (
	maxSimRate     = 100_000
	maxDestRate    = 1e9
	maxSimPartners = 1000
)

// parseEndpoints parses -endpoints: partner=URL pairs separated by commas.
// A partner named twice is an error (the last one silently won).
func parseEndpoints(s string) (map[string]string, error) {
	partners := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		p, u, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || p == "" || u == "" {
			return nil, fmt.Errorf("-endpoints: %q is not partner=URL", kv)
		}
		if prev, dup := partners[p]; dup {
			return nil, fmt.Errorf("-endpoints: partner %q given twice (%s and %s)", p, prev, u)
		}
		partners[p] = u
	}
	return partners, nil
}

// loopbackOnly reports whether a listen address accepts connections from
// this machine only: a loopback IP or "localhost". An empty host (":8081"),
// 0.0.0.0, [::] or any other name or address is not.
func loopbackOnly(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// readSecrets reads and parses the -secrets-file at path.
func readSecrets(path string) (map[string][]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-secrets-file: %w (need a file of lines 'partner whsec_...')", err)
	}
	return parseSecrets(string(b))
}

// parseSecrets reads -secrets-file: "partner whsec_... [whsec_...]" per
// line; blank lines and lines starting with # are skipped. A partner named
// twice is an error. The secrets are checked by service.New (which names
// the partner, never the secret).
func parseSecrets(text string) (map[string][]string, error) {
	out := map[string][]string{}
	text = strings.TrimPrefix(text, "\ufeff") // a UTF-8 byte order mark (Windows editors)
	for i, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if len(f) < 2 {
			return nil, fmt.Errorf("-secrets-file line %d: need 'partner whsec_...'", i+1)
		}
		// A line whose partner was left out ('whsec_old whsec_new'):
		// its first secret would be taken for a partner's name, and
		// shown (in the Warn of partners not configured).
		if strings.HasPrefix(f[0], signing.SecretPrefix) {
			return nil, fmt.Errorf("-secrets-file line %d: starts with a secret (not shown), not a partner name: need 'partner whsec_...'", i+1)
		}
		if _, dup := out[f[0]]; dup {
			return nil, fmt.Errorf("-secrets-file line %d: partner %s given twice", i+1, shownName(f[0]))
		}
		out[f[0]] = f[1:]
	}
	return out, nil
}

// readsAsSecret reports whether a -secrets-file partner name reads as a
// signing secret (plain base64: a line whose partner was left out); such a
// name is never shown in an error or a log line.
func readsAsSecret(p string) bool {
	_, err := signing.ParseSecret(p)
	return err == nil
}

// shownName is a -secrets-file partner name as errors show it: quoted,
// unless it reads as a signing secret.
func shownName(p string) string {
	if readsAsSecret(p) {
		return "(a name that reads as a signing secret: not shown)"
	}
	return strconv.Quote(p)
}

// endpointPartners parses -endpoints and keeps, of secrets (read from
// -secrets-file), those of its partners (keepConfiguredSecrets); a partner
// of -endpoints without a secret is refused, naming both flags.
func endpointPartners(o options, secrets map[string][]string, log *slog.Logger) (map[string]string, error) {
	partners, err := parseEndpoints(o.endpoints)
	if err != nil {
		return nil, err
	}
	if err := keepConfiguredSecrets(partners, secrets, "-endpoints", log); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(partners))
	for p := range partners {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		if len(secrets[p]) == 0 {
			return nil, fmt.Errorf("-secrets-file %s has no secret for partner %q of -endpoints: add a line '%s whsec_...' (every request is signed), or remove the partner from -endpoints", o.secretsFile, p, p)
		}
	}
	return partners, nil
}

// keepConfiguredSecrets drops from secrets (read from -secrets-file) the
// partners not in partners, with one Warn line naming them and the flag
// that configures partners (configured names): one secrets file may serve
// instances configured with different partners, and a partner removed
// from -endpoints may keep its line. The secrets kept are checked here,
// naming -secrets-file and the partner (never the secret).
func keepConfiguredSecrets(partners map[string]string, secrets map[string][]string, configured string, log *slog.Logger) error {
	var extra []string
	for p := range secrets {
		if _, ok := partners[p]; !ok {
			extra = append(extra, p)
			delete(secrets, p)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		var shown []string
		hidden := 0
		for _, p := range extra {
			if readsAsSecret(p) {
				hidden++ // a line whose partner was left out: never shown
				continue
			}
			shown = append(shown, p)
		}
		attrs := []any{"partners", strings.Join(shown, ",")}
		if hidden > 0 {
			attrs = append(attrs, "not_shown", fmt.Sprintf("%d whose name reads as a signing secret (a line without its partner?)", hidden))
		}
		log.Warn("-secrets-file: ignoring the secrets of partners not configured in "+configured, attrs...)
	}
	for p, list := range secrets {
		for i, raw := range list {
			if _, err := signing.ParseSecret(raw); err != nil {
				return fmt.Errorf("-secrets-file, partner %q, secret %d: %w", p, i+1, err)
			}
		}
	}
	return nil
}

func run() error {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: o.level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Partners, their endpoints and signing secrets.
	partners := map[string]string{}
	secrets := map[string][]string{}
	if o.secretsFile != "" {
		if secrets, err = readSecrets(o.secretsFile); err != nil {
			return err
		}
	}
	var endpoints []*sim.Endpoint
	var rec *sim.Recorder
	if o.endpoints != "" {
		if partners, err = endpointPartners(o, secrets, log); err != nil {
			return err
		}
	} else {
		rec = sim.NewRecorder()
		eps, err := simulate(o.partners, rec, partners)
		if err != nil {
			return err
		}
		if err := keepConfiguredSecrets(partners, secrets, "-partners (the simulated partners)", log); err != nil {
			return err
		}
		// The simulated endpoints verify every request's signature with
		// the partner's secrets (from -secrets-file, else fresh ones).
		for p := range partners {
			if secrets[p] == nil {
				sec, err := rec.NewSecret(p)
				if err != nil {
					return err
				}
				secrets[p] = []string{sec}
			} else if err := rec.AddSecrets(p, secrets[p]...); err != nil {
				return fmt.Errorf("-secrets-file, partner %q: %w", p, err)
			}
		}
		endpoints = eps
		defer func() {
			for _, e := range endpoints {
				_ = e.Close()
			}
		}()
	}

	// The database.
	var store *service.Store
	if o.postgres != "" {
		store, err = service.OpenPostgres(ctx, o.postgres)
	} else {
		path := o.dbPath
		o.tempDB = path == ""
		if path == "" {
			dir, err := os.MkdirTemp("", "keysched-webhook-")
			if err != nil {
				return err
			}
			// Removed when run returns, after the store is closed (defers
			// run last-in first-out), on Ctrl-C and SIGTERM too: the
			// signals end ctx, and run returns.
			defer func() {
				if err := os.RemoveAll(dir); err != nil {
					log.Warn("removing the temporary database", "dir", dir, "err", err)
				} else {
					log.Info("removed the temporary database (-db FILE keeps one)", "dir", dir)
				}
			}()
			path = filepath.Join(dir, "webhook.db")
		}
		o.dbPath = path
		store, err = service.OpenSQLite(ctx, path)
	}
	if err != nil {
		return err
	}
	defer store.Close()

	mp, metricsHandler, err := service.NewPrometheus()
	if err != nil {
		return err
	}
	defer func() { _ = mp.Shutdown(context.Background()) }()

	svc, err := service.New(ctx, service.Config{
		Partners:         partners,
		Secrets:          secrets,
		AdminToken:       o.adminToken,
		MaxRetryAfter:    o.maxRetryAfter,
		BacklogSync:      o.backlogSync,
		MaxBacklog:       o.maxBacklog,
		Workers:          o.workers,
		Limits:           service.DestinationLimits{Concurrency: o.concurrency, Rate: o.rate, Burst: max(1, int(o.rate/4))},
		Timeout:          o.timeout,
		LeaseDuration:    o.lease,
		RelayName:        o.relayName,
		Breaker:          service.BreakerSettings{Failures: uint32(min(o.brkFailures, 1<<31)), OpenFor: o.brkOpen},
		Retry:            keysched.RetryPolicy{MaxAttempts: o.attempts, InitialBackoff: o.backoff, MaxBackoff: 30 * time.Second},
		Logger:           log,
		MeterProvider:    mp,
		MetricsHandler:   metricsHandler,
		Store:            store,
		History:          o.history,
		SkipUnconfigured: o.skipUnconf,
	})
	if err != nil {
		return err
	}

	if o.adminToken == "" {
		log.Warn("the admin address has no token: anyone on this machine can resume or skip partners (set -admin-token or $WEBHOOK_ADMIN_TOKEN)", "admin", o.admin)
	}

	intakeLn, err := net.Listen("tcp", o.intake)
	if err != nil {
		_ = svc.Close(context.Background())
		return err
	}
	adminLn, err := net.Listen("tcp", o.admin)
	if err != nil {
		_ = intakeLn.Close()
		_ = svc.Close(context.Background())
		return err
	}
	intakeSrv := &http.Server{Handler: svc.IntakeHandler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
	adminSrv := &http.Server{Handler: svc.AdminHandler(), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 2)
	go func() { errc <- intakeSrv.Serve(intakeLn) }()
	go func() { errc <- adminSrv.Serve(adminLn) }()

	intakeURL := "http://" + intakeLn.Addr().String()
	adminURL := "http://" + adminLn.Addr().String()
	names := make([]string, 0, len(partners))
	for p := range partners {
		names = append(names, p)
	}
	sort.Strings(names)
	fmt.Printf("webhook delivery service running\n")
	fmt.Printf("  intake:        %s/events/{partner}   (POST {\"type\":\"...\",\"data\":{...}})\n", intakeURL)
	fmt.Printf("  operator page: %s/\n", adminURL)
	fmt.Printf("  metrics:       %s/metrics\n", adminURL)
	fmt.Printf("  an event:      %s/events/{id} (JSON), %s/ui/events/{id} (page)\n", adminURL, adminURL)
	if o.postgres == "" {
		fmt.Printf("  database:      %s (SQLite)\n", o.dbPath)
	} else {
		fmt.Printf("  database:      PostgreSQL\n")
	}
	fmt.Printf("  partners:      %s\n", strings.Join(names, ", "))
	fmt.Printf("  try:           curl -i -H 'Content-Type: application/json' -d '{\"type\":\"order.created\",\"data\":{\"n\":1}}' %s/events/%s\n", intakeURL, names[0])
	fmt.Printf("READY intake=%s admin=%s\n", intakeURL, adminURL)

	if len(endpoints) > 0 && o.simRate > 0 {
		go produce(ctx, intakeURL, names, o.simRate, log)
		go chaos(ctx, endpoints, log)
	}
	if rec != nil {
		go watchSignatures(ctx, rec, log)
	}

	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	if o.tempDB {
		log.Info("shutting down: the temporary database goes, with its undelivered events")
	} else {
		log.Info("shutting down: undelivered events stay in the database")
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = intakeSrv.Shutdown(sctx)
	_ = adminSrv.Shutdown(sctx)
	return errors.Join(err, svc.Close(sctx))
}
