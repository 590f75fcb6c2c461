// Command example serves a keysched scheduler's metrics on /metrics with the
// OpenTelemetry Prometheus exporter, and its deepest keys on /debug/keys,
// while a small synthetic workload runs: order events for 50 accounts at
// about 500 a second on 8 workers (well below saturation: pending stays
// small), of which acct-7's take 50 ms each (the slow key: its depth and head
// age lead /debug/keys), and acct-bad, whose first event fails for good and
// parks the key: its second event waits behind it for ever, so
// keysched.tasks.oldest_age grows without bound, as the alert in
// docs/operating.md would say. Stop it with Ctrl-C or SIGTERM.
//
//	go run ./otelkeysched/example -addr 127.0.0.1:9464
//	curl -s localhost:9464/metrics | grep keysched_
//	curl -s localhost:9464/debug/keys
//
// It is a module of its own so that the Prometheus exporter (and its
// dependencies) stay out of otelkeysched's requirements.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/otelkeysched"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9464", "address to serve /metrics and /debug/keys on")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		slog.Error("listen", "err", err)
		os.Exit(1)
	}
	slog.Info("serving", "metrics", "http://"+ln.Addr().String()+"/metrics")
	if err := run(ctx, ln, true, nil); err != nil {
		slog.Error("example", "err", err)
		os.Exit(1)
	}
}

// run serves on ln until ctx ends. With forever, the workload goes on
// submitting events; without, it submits one known batch (see workload) and
// then only serves. ready, if not nil, is called once the known batch has
// settled: its successes done, the bad account parked.
func run(ctx context.Context, ln net.Listener, forever bool, ready func()) error {
	// The OpenTelemetry SDK with the Prometheus exporter as its reader, on a
	// registry of our own.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(context.Background()) }() // at exit: nothing left to report to

	var parked sync.Once
	parkedCh := make(chan struct{})

	// The scheduler, observed: Metrics' Observer records the histograms,
	// Register reads the counters at every scrape.
	m, err := otelkeysched.New[string](mp, otelkeysched.WithAttributes(attribute.String("scheduler", "orders")))
	if err != nil {
		return err
	}
	s, err := keysched.New[string](keysched.WithWorkers(8),
		keysched.WithObserver(m.Observer()),
		keysched.WithFailurePolicy(keysched.Park),
		keysched.WithDeadLetter(func(dl keysched.DeadLetter[string]) {
			// Called with the key already parked.
			parked.Do(func() { close(parkedCh) })
		}),
		keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond}))
	if err != nil {
		return err
	}
	if err := m.Register(s); err != nil {
		return err
	}
	defer func() { _ = m.Unregister() }() // at exit

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/keys", func(w http.ResponseWriter, r *http.Request) {
		// Per-key detail on demand (never as metric attributes).
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.Keys(10))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	werr := workload(ctx, s, forever, parkedCh)
	if ready != nil {
		ready()
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	for _, k := range s.Parked() {
		_ = s.Skip(k) // what an operator does with a poisoned event, after a look
	}
	cerr := s.Close(sctx)
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return errors.Join(werr, cerr)
}

// workload submits order events: 100 that succeed over 10 accounts, and two
// for "acct-bad": the first fails for good and parks that account, the second
// waits behind it. Then it waits for those to settle (parked is closed by the
// dead-letter function). With forever it goes on with random events (one
// every 2 ms, acct-7's slow) until ctx ends.
func workload(ctx context.Context, s *keysched.Scheduler[string], forever bool, parked <-chan struct{}) error {
	var cs []*keysched.Completion
	for i := range 100 {
		c, err := s.Submit(ctx, fmt.Sprintf("acct-%d", i%10), func(context.Context) error { return nil })
		if err != nil {
			return err
		}
		cs = append(cs, c)
	}
	if _, err := s.Submit(ctx, "acct-bad", func(context.Context) error {
		return keysched.Permanent(errors.New("card declined"))
	}); err != nil {
		return err
	}
	if _, err := s.Submit(ctx, "acct-bad", func(context.Context) error { return nil }); err != nil {
		return err
	}
	for _, c := range cs {
		if err := c.Wait(ctx); err != nil {
			return err
		}
	}
	select {
	case <-parked:
	case <-ctx.Done():
		return ctx.Err()
	}
	for forever {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Millisecond):
		}
		acct := rand.IntN(50)
		d := time.Duration(rand.IntN(2000)) * time.Microsecond
		if acct == 7 {
			d = 50 * time.Millisecond // the slow key: about 10 events a second, half a worker
		}
		_, err := s.Submit(ctx, fmt.Sprintf("acct-%d", acct), func(ctx context.Context) error {
			select {
			case <-time.After(d):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return nil
}
