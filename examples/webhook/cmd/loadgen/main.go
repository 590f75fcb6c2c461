// Command loadgen runs the webhook service in-process on a fresh SQLite
// database, with simulated customer endpoints on loopback, and drives its
// intake with a burst of events: by default 50,000 events over one minute,
// spread over 200 partners, 5% of whose endpoints are slow or failing. It then
// runs the same burst with every endpoint healthy, and prints, for both runs:
// intake latency (p50, p99, p99.9, max; measured from each request's
// scheduled send time, so a stalled intake cannot hide its queue: no
// coordinated omission), delivery throughput, and the healthy partners'
// delivery latency (intake to first arrival at the endpoint).
//
//	go run ./examples/webhook/cmd/loadgen                         # the full run (about 2-3 minutes)
//	go run ./examples/webhook/cmd/loadgen -events 3000 -over 5s   # a short one
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/service"
	"github.com/keysched/keysched/examples/webhook/sim"
)

type params struct {
	partners    int
	events      int
	over        time.Duration
	bad         float64
	slowDelay   time.Duration
	failRate    float64
	timeout     time.Duration
	workers     int
	senders     int
	drain       time.Duration
	compare     bool
	logLevel    string
	maxBacklog  int
	attempts    int
	concurrency int
}

func main() {
	var p params
	flag.IntVar(&p.partners, "partners", 200, "partners (one endpoint each)")
	flag.IntVar(&p.events, "events", 50000, "events in the burst")
	flag.DurationVar(&p.over, "over", time.Minute, "the burst's duration (events are sent at an even rate over it)")
	flag.Float64Var(&p.bad, "bad", 0.05, "fraction of partners whose endpoint is slow (half of them) or failing (the other half)")
	flag.DurationVar(&p.slowDelay, "slow", 2*time.Second, "answer time of a slow endpoint")
	flag.Float64Var(&p.failRate, "fail", 0.5, "fraction of calls a failing endpoint answers 500")
	flag.DurationVar(&p.timeout, "timeout", 5*time.Second, "delivery timeout")
	flag.IntVar(&p.workers, "workers", 64, "the service's pool for outbound calls")
	flag.IntVar(&p.senders, "senders", 0, "concurrent intake requests at most; each partner's events go through one sender, in order (default: one sender per partner)")
	flag.DurationVar(&p.drain, "drain", 2*time.Minute, "how long to wait after the burst for the healthy partners' events")
	flag.BoolVar(&p.compare, "compare", true, "also run the burst with every endpoint healthy")
	flag.StringVar(&p.logLevel, "log", "error", "the service's log level")
	flag.IntVar(&p.maxBacklog, "max-backlog", 10000, "per-partner backlog bound (429 above)")
	flag.IntVar(&p.attempts, "attempts", 8, "delivery attempts before a partner is parked")
	flag.IntVar(&p.concurrency, "dest-concurrency", 4, "bulkhead: calls in flight per destination")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if p.partners < 1 || p.events < 1 || p.over <= 0 || p.bad < 0 || p.bad > 1 {
		fmt.Fprintln(os.Stderr, "loadgen: need -partners >= 1, -events >= 1, -over > 0, 0 <= -bad <= 1")
		os.Exit(2)
	}
	if err := runAll(p); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func runAll(p params) error {
	if p.senders <= 0 {
		p.senders = p.partners
	}
	var results []result
	r, err := runOnce(p, p.bad)
	if err != nil {
		return err
	}
	results = append(results, r)
	if p.compare && p.bad > 0 {
		r, err := runOnce(p, 0)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	printResults(p, results)
	return nil
}

type result struct {
	name                 string
	badPartners          int
	sent, accepted, r429 int64
	errors               int64
	intake               *hdrhistogram.Histogram // µs
	healthy              *hdrhistogram.Histogram // µs, first arrivals of healthy partners' events
	healthyAccepted      int
	healthyDelivered     int
	badAccepted          int
	badDelivered         int
	duplicates           int64
	deliveries           int64 // first arrivals, all partners
	elapsed              time.Duration
	healthyDone          time.Duration // from the first send to the last healthy first arrival
	parked               int
	orderViolations      int
	badSignatures        int // requests the endpoints refused: signature failed verification
	drainedHealthy       bool
}

func runOnce(p params, bad float64) (result, error) {
	res := result{name: fmt.Sprintf("%.0f%% bad endpoints", bad*100)}
	if bad == 0 {
		res.name = "all endpoints healthy"
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(p.logLevel))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Endpoints.
	var (
		mu       sync.Mutex
		seen     = map[string]bool{}
		accepted = map[string][]string{} // partner -> IDs in acceptance order (per partner, one sender at a time is not guaranteed; see below)
		isBad    = map[string]bool{}
	)
	res.intake = hdrhistogram.New(1, 60_000_000, 3)
	res.healthy = hdrhistogram.New(1, 600_000_000, 3)
	var lastHealthy atomic.Int64
	var healthyFirst atomic.Int64
	rec := sim.NewRecorder()
	rec.OnDelivery = func(d sim.Delivery) {
		var env service.Envelope
		if err := json.Unmarshal(d.Body, &env); err != nil {
			return
		}
		mu.Lock()
		first := !seen[d.ID]
		seen[d.ID] = true
		b := isBad[d.Partner]
		if first {
			res.deliveries++
			if !b {
				_ = res.healthy.RecordValue(max(1, d.At.Sub(env.Received).Microseconds()))
			}
		} else {
			res.duplicates++
		}
		mu.Unlock()
		if first && !b {
			healthyFirst.Add(1)
			lastHealthy.Store(d.At.UnixNano())
		}
	}
	partners := map[string]string{}
	secrets := map[string][]string{}
	names := make([]string, p.partners)
	nBad := int(float64(p.partners)*bad + 0.5)
	res.badPartners = nBad
	var eps []*sim.Endpoint
	defer func() {
		for _, e := range eps {
			_ = e.Close()
		}
	}()
	for i := range p.partners {
		name := fmt.Sprintf("p%03d", i)
		names[i] = name
		b := sim.Behavior{Delay: time.Millisecond}
		if i < nBad {
			isBad[name] = true
			if i%2 == 0 {
				b = sim.Behavior{Delay: p.slowDelay}
			} else {
				b = sim.Behavior{Delay: time.Millisecond, FailRate: p.failRate}
			}
		}
		e, err := sim.NewEndpoint(rec, b)
		if err != nil {
			return res, err
		}
		eps = append(eps, e)
		partners[name] = e.URL
		// The endpoint verifies every request's Standard Webhooks
		// signature with the partner's secret.
		sec, err := rec.NewSecret(name)
		if err != nil {
			return res, err
		}
		secrets[name] = []string{sec}
	}

	// The service.
	dir, err := os.MkdirTemp("", "webhook-loadgen-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	store, err := service.OpenSQLite(ctx, filepath.Join(dir, "load.db"))
	if err != nil {
		return res, err
	}
	defer store.Close()
	svc, err := service.New(ctx, service.Config{
		Partners:   partners,
		Secrets:    secrets,
		MaxBacklog: p.maxBacklog,
		Workers:    p.workers,
		Limits:     service.DestinationLimits{Concurrency: p.concurrency, Rate: 500, Burst: 100},
		Timeout:    p.timeout,
		Retry:      keysched.RetryPolicy{MaxAttempts: p.attempts, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second},
		Breaker:    service.BreakerSettings{Failures: 5, OpenFor: 2 * time.Second},
		Logger:     log,
		Store:      store,
	})
	if err != nil {
		return res, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	srv := &http.Server{Handler: svc.IntakeHandler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	intake := "http://" + ln.Addr().String() + "/events/"

	// The burst: event i is due at start + i*interval; senders take due
	// events in order. Latency counts from the due time.
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: p.senders}}
	interval := p.over / time.Duration(p.events)
	type job struct {
		due     time.Time
		partner string
		seq     int
	}
	var wg sync.WaitGroup
	// Per-partner acceptance order: the service orders a partner's events
	// as it accepted them; with several senders, two events of one partner
	// in flight at once have no order between them. Each partner's events
	// are therefore sent by one sender (partner i by sender i % senders).
	lanes := make([]chan job, p.senders)
	for s := range p.senders {
		lanes[s] = make(chan job, 1024)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range lanes[s] {
				atomic.AddInt64(&res.sent, 1)
				body := fmt.Sprintf(`{"type":"load.event","data":{"seq":%d,"pad":"%s"}}`, j.seq, padding)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, intake+j.partner, bytes.NewBufferString(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				lat := time.Since(j.due)
				mu.Lock()
				_ = res.intake.RecordValue(max(1, lat.Microseconds()))
				mu.Unlock()
				if err != nil {
					atomic.AddInt64(&res.errors, 1)
					continue
				}
				var ir service.IntakeResponse
				data, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusAccepted:
					if json.Unmarshal(data, &ir) == nil {
						mu.Lock()
						accepted[j.partner] = append(accepted[j.partner], ir.ID)
						mu.Unlock()
						atomic.AddInt64(&res.accepted, 1)
					}
				case http.StatusTooManyRequests:
					atomic.AddInt64(&res.r429, 1)
				default:
					atomic.AddInt64(&res.errors, 1)
				}
			}
		}()
	}
	start := time.Now()
	for i := range p.events {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		pi := rand.IntN(p.partners)
		lanes[pi%p.senders] <- job{due: due, partner: names[pi], seq: i}
	}
	for _, l := range lanes {
		close(l)
	}
	wg.Wait()

	// Wait for the healthy partners' events.
	for _, n := range names {
		if isBad[n] {
			res.badAccepted += len(accepted[n])
		} else {
			res.healthyAccepted += len(accepted[n])
		}
	}
	deadline := time.Now().Add(p.drain)
	for time.Now().Before(deadline) && int(healthyFirst.Load()) < res.healthyAccepted {
		time.Sleep(50 * time.Millisecond)
	}
	res.drainedHealthy = int(healthyFirst.Load()) >= res.healthyAccepted
	res.elapsed = time.Since(start)
	if t := lastHealthy.Load(); t > 0 {
		res.healthyDone = time.Unix(0, t).Sub(start)
	}
	if pk, err := svc.Parked(ctx); err == nil {
		res.parked = len(pk)
	}

	// Order check per partner, on what arrived so far (bad partners' tails
	// may still be pending: check the prefix that arrived).
	mu.Lock()
	for _, n := range names {
		got := rec.IDs(n)
		acc := accepted[n]
		if isBad[n] {
			res.badDelivered += countFirst(got)
			acc = acc[:min(len(acc), countFirst(got))]
		} else {
			res.healthyDelivered += countFirst(got)
		}
		if _, err := sim.CheckOrder(acc, got); err != nil {
			var oe *sim.OrderError
			if !(isBad[n] && errors.As(err, &oe) && oe.Missing > 0) {
				res.orderViolations++
			}
		}
	}
	mu.Unlock()
	res.badSignatures, _ = rec.BadSignatures()

	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	_ = srv.Shutdown(sctx)
	_ = svc.Close(sctx)
	return res, nil
}

var padding = string(bytes.Repeat([]byte("x"), 200))

func countFirst(ids []string) int {
	m := map[string]bool{}
	for _, id := range ids {
		m[id] = true
	}
	return len(m)
}

func ms(us int64) string { return fmt.Sprintf("%.1fms", float64(us)/1000) }

func printResults(p params, rs []result) {
	fmt.Printf("burst: %d events over %v to %d partners; delivery timeout %v, %d workers, bulkhead %d per destination\n",
		p.events, p.over, p.partners, p.timeout, p.workers, p.concurrency)
	fmt.Printf("bad endpoints: half answer after %v, half fail %.0f%% of calls\n\n", p.slowDelay, p.failRate*100)
	fmt.Printf("%-24s %9s %6s %6s %9s %9s %9s %9s %12s %11s %11s %11s %13s %8s %6s %6s %6s\n",
		"run", "accepted", "429", "errors", "intake50", "intake99", "intake999", "intakemax",
		"deliveries/s", "healthy50", "healthy99", "healthy999", "healthy done", "bad dlv", "dups", "order", "badsig")
	for _, r := range rs {
		rate := 0.0
		if r.healthyDone > 0 {
			rate = float64(r.healthyDelivered) / r.healthyDone.Seconds()
		}
		hd := fmt.Sprintf("%d/%d", r.healthyDelivered, r.healthyAccepted)
		bd := fmt.Sprintf("%d/%d", r.badDelivered, r.badAccepted)
		fmt.Printf("%-24s %9d %6d %6d %9s %9s %9s %9s %12.0f %11s %11s %11s %13s %8s %6d %6d %6d\n",
			r.name, r.accepted, r.r429, r.errors,
			ms(r.intake.ValueAtQuantile(50)), ms(r.intake.ValueAtQuantile(99)), ms(r.intake.ValueAtQuantile(99.9)), ms(r.intake.Max()),
			rate,
			ms(r.healthy.ValueAtQuantile(50)), ms(r.healthy.ValueAtQuantile(99)), ms(r.healthy.ValueAtQuantile(99.9)),
			hd, bd, r.duplicates, r.orderViolations, r.badSignatures)
		if !r.drainedHealthy {
			fmt.Printf("  (healthy partners not fully delivered within -drain)\n")
		}
		if r.parked > 0 {
			fmt.Printf("  %d partners parked at the end (their later events wait for an operator)\n", r.parked)
		}
	}
	fmt.Printf("\ndeliveries/s: healthy partners' first arrivals / time from the burst's start to the last one.\n")
	fmt.Printf("healthy50/99/999: intake (service clock) to first arrival at the endpoint, healthy partners only.\n")
	fmt.Printf("badsig: requests an endpoint refused (401) because their webhook-signature did not verify; must be 0.\n")
}
