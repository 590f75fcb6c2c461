package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/signing"
	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/sony/gobreaker/v2"
	"github.com/stretchr/testify/require"
)

func newEndpoint(t *testing.T, rec *sim.Recorder, b sim.Behavior) *sim.Endpoint {
	t.Helper()
	e, err := sim.NewEndpoint(rec, b)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// testDeliverer makes a Deliverer for endpoints, each partner with a fresh
// signing secret that rec's endpoints accept (rec may be nil for endpoints
// that are no sim.Endpoint).
func testDeliverer(t *testing.T, rec *sim.Recorder, endpoints map[string]string, mod func(*DelivererConfig)) *Deliverer {
	t.Helper()
	secrets := map[string][]signing.Secret{}
	for p := range endpoints {
		s, err := signing.NewSecret()
		require.NoError(t, err)
		secrets[p] = []signing.Secret{s}
		if rec != nil {
			require.NoError(t, rec.AddSecrets(p, s.Encode()))
		}
	}
	cfg := DelivererConfig{
		Endpoints: endpoints,
		Secrets:   secrets,
		Limits:    DestinationLimits{Concurrency: 4, Rate: 1000, Burst: 100},
		Breaker:   BreakerSettings{Failures: 3, OpenFor: 50 * time.Millisecond},
		Timeout:   2 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	d, err := NewDeliverer(cfg)
	require.NoError(t, err)
	t.Cleanup(d.Close)
	return d
}

func TestDeliverCarriesStableID(t *testing.T) {
	rec := sim.NewRecorder()
	ep := newEndpoint(t, rec, sim.Behavior{Down: true})
	d := testDeliverer(t, rec, map[string]string{"p": ep.URL}, nil)
	ev := Delivery{Partner: "p", ID: "evt-1", Received: time.Now(), Body: []byte(`{"id":"evt-1"}`)}
	var se *StatusError
	require.ErrorAs(t, d.Deliver(t.Context(), ev), &se)
	require.Equal(t, 503, se.Code)
	ep.Set(sim.Behavior{})
	require.NoError(t, d.Deliver(t.Context(), ev))
	require.NoError(t, d.Deliver(t.Context(), ev)) // a redelivery: same ID
	require.Equal(t, []string{"evt-1", "evt-1"}, rec.IDs("p"))
	_, received := rec.Total()
	require.Equal(t, 3, received)
}

func TestDeliverUnknownPartnerAndBadConfig(t *testing.T) {
	d := testDeliverer(t, nil, map[string]string{"p": "http://127.0.0.1:1/x"}, nil)
	require.ErrorIs(t, d.Deliver(t.Context(), Delivery{Partner: "nobody", ID: "x"}), ErrUnknownPartner)

	for _, cfg := range []DelivererConfig{
		{Endpoints: map[string]string{"p": "ftp://x"}, Limits: DestinationLimits{1, 1, 1}, Breaker: BreakerSettings{1, time.Second}, Timeout: time.Second},
		{Endpoints: map[string]string{"p": "http://x"}, Limits: DestinationLimits{0, 1, 1}, Breaker: BreakerSettings{1, time.Second}, Timeout: time.Second},
		{Endpoints: map[string]string{"p": "http://x"}, Limits: DestinationLimits{1, 1, 1}, Breaker: BreakerSettings{0, time.Second}, Timeout: time.Second},
		{Endpoints: map[string]string{"p": "http://x"}, Limits: DestinationLimits{1, 1, 1}, Breaker: BreakerSettings{1, time.Second}},
	} {
		_, err := NewDeliverer(cfg)
		require.ErrorIs(t, err, ErrInvalidConfig)
	}
}

func TestBreakerOpensAndRecovers(t *testing.T) {
	rec := sim.NewRecorder()
	ep := newEndpoint(t, rec, sim.Behavior{Down: true})
	d := testDeliverer(t, rec, map[string]string{"p": ep.URL}, nil)
	for range 3 {
		var se *StatusError
		require.ErrorAs(t, d.Deliver(t.Context(), Delivery{Partner: "p", ID: "x"}), &se)
	}
	st, _ := d.BreakerState(d.Destination("p"))
	require.Equal(t, gobreaker.StateOpen, st)
	require.ErrorIs(t, d.Deliver(t.Context(), Delivery{Partner: "p", ID: "x"}), gobreaker.ErrOpenState)
	_, received := rec.Total()
	require.Equal(t, 3, received, "an open breaker does not call the endpoint")
	ep.Set(sim.Behavior{})
	// After OpenFor one call goes through (half-open) and closes it.
	require.Eventually(t, func() bool { return d.Deliver(t.Context(), Delivery{Partner: "p", ID: "x"}) == nil },
		10*time.Second, 5*time.Millisecond)
	st, _ = d.BreakerState(d.Destination("p"))
	require.Equal(t, gobreaker.StateClosed, st)
}

func TestRateLimitDoesNotTripBreaker(t *testing.T) {
	rec := sim.NewRecorder()
	ep := newEndpoint(t, rec, sim.Behavior{})
	d := testDeliverer(t, rec, map[string]string{"p": ep.URL}, func(c *DelivererConfig) {
		c.Limits = DestinationLimits{Concurrency: 4, Rate: 0.001, Burst: 1}
		c.Timeout = time.Second
		c.Breaker.Failures = 1
	})
	require.NoError(t, d.Deliver(t.Context(), Delivery{Partner: "p", ID: "1"}))
	for range 5 {
		require.ErrorIs(t, d.Deliver(t.Context(), Delivery{Partner: "p", ID: "2"}), ErrRateLimited)
	}
	st, _ := d.BreakerState(d.Destination("p"))
	require.Equal(t, gobreaker.StateClosed, st)
	_, received := rec.Total()
	require.Equal(t, 1, received)
}

func TestDeliverTimesOut(t *testing.T) {
	rec := sim.NewRecorder()
	ep := newEndpoint(t, rec, sim.Behavior{Hang: true})
	d := testDeliverer(t, rec, map[string]string{"p": ep.URL}, func(c *DelivererConfig) { c.Timeout = 100 * time.Millisecond })
	err := d.Deliver(t.Context(), Delivery{Partner: "p", ID: "1"})
	var ne net.Error
	if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("want a timeout, got %v", err)
	}
}

// Refused tells the local refusals (no call made) from failed calls: only
// the former are snoozed by the sink instead of counted as attempts.
func TestRefused(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("x: %w", ErrBulkheadFull),
		fmt.Errorf("x: %w", ErrRateLimited),
		fmt.Errorf("deliver: %w", gobreaker.ErrOpenState),
		fmt.Errorf("deliver: %w", gobreaker.ErrTooManyRequests),
	} {
		require.True(t, Refused(err), "%v", err)
	}
	for _, err := range []error{
		&StatusError{Code: 503},
		context.DeadlineExceeded,
		errors.New("connection refused"),
		nil,
	} {
		require.False(t, Refused(err), "%v", err)
	}
}

// Found by attacking the code (adversarial review of the service: first written as a failing reproducer).
//
// A PerDestination limit whose key is not exactly "scheme://host:port" (the
// port left out, as URLs usually are) or names a host no partner uses was
// silently ignored: the destination ran with the defaults. Now the key is
// normalised, and one that matches no destination is an error.
func TestPerDestinationKeysAreCheckedAndNormalised(t *testing.T) {
	base := func(per map[string]DestinationLimits) DelivererConfig {
		return DelivererConfig{
			Endpoints:      map[string]string{"p": "https://api.example.com/hooks", "q": "http://10.0.0.1:8080/x"},
			Secrets:        map[string][]signing.Secret{"p": {testSecret(t)}, "q": {testSecret(t)}},
			Limits:         DestinationLimits{8, 100, 10},
			PerDestination: per,
			Breaker:        BreakerSettings{1, time.Second},
			Timeout:        time.Second,
		}
	}
	for _, per := range []map[string]DestinationLimits{
		{"https://other.example.com": {1, 1, 1}},                                         // no partner's
		{"http://api.example.com": {1, 1, 1}},                                            // wrong scheme: port 80
		{"api.example.com:443": {1, 1, 1}},                                               // no scheme
		{"https://api.example.com": {0, 1, 1}},                                           // bad limits
		{"https://api.example.com": {1, 1, 1}, "https://api.example.com:443": {2, 1, 1}}, // two limits for one
	} {
		_, err := NewDeliverer(base(per))
		require.ErrorIs(t, err, ErrInvalidConfig, "%v", per)
	}
	d, err := NewDeliverer(base(map[string]DestinationLimits{
		"https://api.example.com":   {Concurrency: 1, Rate: 1, Burst: 1},
		"http://10.0.0.1:8080/path": {Concurrency: 2, Rate: 2, Burst: 2},
	}))
	require.NoError(t, err)
	defer d.Close()
	// The bulkhead of api.example.com is 1: one slot, then full.
	dst := d.byPartner["p"]
	require.Equal(t, "https://api.example.com:443", dst.name)
	require.True(t, dst.bulkhead.TryAcquire(1))
	require.False(t, dst.bulkhead.TryAcquire(1), "the PerDestination limit applied")
	dst.bulkhead.Release(1)
	require.Equal(t, 2, d.byPartner["q"].limiter.Burst())
}

// Found by attacking the code (adversarial review of the service: first written as a failing reproducer).
//
// Two partners share a destination whose bulkhead is 1 and whose endpoint
// is healthy but slow: the second partner's attempts are refused locally
// (ErrBulkheadFull) while the first's call is in flight. A refusal made no
// call, so the sink returns it wrapped in keysched.Snooze and it does not
// count against Retry.MaxAttempts: nobody is parked, every event arrives.
// (Before, each refusal counted like a failed call and the partner was
// parked although its endpoint never failed; likewise an open breaker's or
// the rate limiter's refusals.)
func TestBusySharedDestinationDoesNotParkHealthyPartner(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"a": {Delay: 100 * time.Millisecond}}, func(c *Config) {
		c.Partners["b"] = c.Partners["a"]
		c.Limits.Concurrency = 1
		c.Retry = keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	})
	for i := range 3 {
		h.post("a", i)
		h.post("b", i)
	}
	require.Eventually(t, func() bool { return h.delivered("a") && h.delivered("b") || len(h.parked()) > 0 }, waitLong, 5*time.Millisecond)
	require.Empty(t, h.parked(), "no endpoint call failed")
	h.checkOrder("a")
	h.checkOrder("b")
	require.Positive(t, h.svc.relay.scheduler().Stats().Snoozed, "the bulkhead refused some attempts (else the test shows nothing)")
	for _, p := range []string{"a", "b"} {
		require.Zero(t, h.status(p).Failed, "partner %s: a refusal is no failed attempt", p)
	}
}
