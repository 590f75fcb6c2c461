package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/keysched/keysched/examples/webhook/signing"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// Headers every delivery carries. The first three are the Standard Webhooks
// specification's (https://www.standardwebhooks.com; package signing): the
// ID is stable across redeliveries of one event, so a customer deduplicates
// on it; the timestamp is the attempt's, as the specification says (a
// receiver refuses a stale one: replay protection), the intake time is the
// body's "received_at"; the signature is one "v1,<base64>" per secret of the
// partner.
const (
	HeaderID        = "Webhook-Id"        // the event's ID, the same on every attempt
	HeaderTimestamp = "Webhook-Timestamp" // the attempt's time, Unix seconds
	HeaderSignature = "Webhook-Signature" // HMAC-SHA256 of id.timestamp.body per secret, space-separated
	HeaderPartner   = "Webhook-Partner"   // the partner (the scheduler key)
)

// Errors a delivery attempt can end with. All of them are retryable. The
// local refusals (ErrBulkheadFull, ErrRateLimited, and gobreaker's
// ErrOpenState and ErrTooManyRequests: see Refused) made no call: the relay
// runs the event again later without counting an attempt (keysched.Snooze).
// The others are failed attempts: the relay retries them with backoff and
// full jitter, then parks the partner.
var (
	// ErrBulkheadFull means the destination already has its concurrency
	// budget of calls in flight (a slow or hanging endpoint): the attempt
	// is refused at once instead of holding a worker (a local refusal, see
	// Refused: it runs again later without spending an attempt).
	ErrBulkheadFull = errors.New("webhook: destination's concurrency budget is in use")
	// ErrRateLimited means the destination's token bucket had no token
	// within the attempt's deadline.
	ErrRateLimited = errors.New("webhook: destination's rate limit")
	// ErrUnknownPartner is returned for an event whose partner has no
	// endpoint configured.
	ErrUnknownPartner = errors.New("webhook: unknown partner")
)

// Refused reports whether err is a local refusal: the attempt made no call
// because the destination's bulkhead was full, its rate limit had no token
// in time, or its circuit breaker was open (or half-open with its trial
// call in flight). Such an attempt says nothing about the partner's
// endpoint; the relay does not count it against Retry.MaxAttempts.
func Refused(err error) bool {
	return errors.Is(err, ErrBulkheadFull) || errors.Is(err, ErrRateLimited) ||
		errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests)
}

// StatusError is the error of a delivery the endpoint answered with a non-2xx
// status. Retrieve it with errors.As (it is inside a *ResponseError, which
// carries the classification and the body's first bytes).
type StatusError struct {
	Code int
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("webhook: endpoint answered %d %s", e.Code, http.StatusText(e.Code))
}

// DestinationLimits bounds the calls to one destination (scheme, host and
// port of an endpoint URL; several partners may share one).
type DestinationLimits struct {
	// Concurrency is the bulkhead: at most this many calls in flight to the
	// destination; a further attempt fails at once with ErrBulkheadFull.
	// A hanging destination therefore holds at most Concurrency workers of
	// the shared pool. >= 1.
	Concurrency int
	// Rate is the token bucket's rate in calls per second, Burst its size.
	// Concurrency is not rate: 20 calls in flight at 50 ms each is 400 a
	// second. Rate > 0, Burst >= 1.
	Rate  float64
	Burst int
}

func (l DestinationLimits) validate() error {
	if l.Concurrency < 1 || !(l.Rate > 0) || l.Burst < 1 {
		return fmt.Errorf("%w: destination limits %+v: need Concurrency >= 1, Rate > 0, Burst >= 1", ErrInvalidConfig, l)
	}
	return nil
}

// BreakerSettings configures the circuit breaker of each destination
// (github.com/sony/gobreaker/v2).
type BreakerSettings struct {
	// Failures is how many consecutive failed calls open the breaker.
	Failures uint32
	// OpenFor is how long an open breaker refuses calls before letting one
	// through (half-open).
	OpenFor time.Duration
}

// destination is one endpoint host's guards.
type destination struct {
	name     string
	bulkhead *semaphore.Weighted
	limiter  *rate.Limiter
	breaker  *gobreaker.CircuitBreaker[struct{}]
}

// Deliverer makes the HTTP calls: one POST per attempt, through the
// destination's bulkhead, token bucket and circuit breaker, with a timeout.
// It is safe for concurrent use; the ordering per partner is the caller's
// (the relay runs one partner's events one at a time).
//
// The zero Deliverer is not usable: use NewDeliverer. Deliver on a nil or
// zero Deliverer returns ErrZeroDeliverer; its other methods return zero
// values and do nothing.
type Deliverer struct {
	client    *http.Client
	timeout   time.Duration
	maxWait   time.Duration
	endpoints map[string]*url.URL // partner -> endpoint
	secrets   map[string][]signing.Secret
	dests     map[string]*destination
	byPartner map[string]*destination
	onState   func(dest string, from, to gobreaker.State)
}

// DelivererConfig configures NewDeliverer.
type DelivererConfig struct {
	Endpoints map[string]string // partner -> endpoint URL (http or https)
	// Secrets maps every partner of Endpoints to its signing secrets (at
	// least one; during a rotation the new and the old, all of them sign
	// every request). A partner without one is an ErrInvalidConfig.
	Secrets map[string][]signing.Secret
	Limits  DestinationLimits // applied to every destination
	// PerDestination overrides Limits for a destination, keyed by
	// "scheme://host:port" (without the port, the scheme's default). A key
	// that is no endpoint's destination is an ErrInvalidConfig.
	PerDestination map[string]DestinationLimits
	Breaker        BreakerSettings
	// Timeout bounds each call from dial to the end of the response body.
	Timeout time.Duration
	// MaxRetryAfter caps the wait a Retry-After asks for (Classify).
	// Default DefaultMaxRetryAfter.
	MaxRetryAfter time.Duration
	// OnBreakerState is called when a destination's breaker changes state.
	OnBreakerState func(dest string, from, to gobreaker.State)
}

// NewDeliverer checks cfg and builds the destinations.
func NewDeliverer(cfg DelivererConfig) (*Deliverer, error) {
	if cfg.Timeout <= 0 {
		return nil, fmt.Errorf("%w: delivery Timeout %v: need > 0", ErrInvalidConfig, cfg.Timeout)
	}
	if err := cfg.Limits.validate(); err != nil {
		return nil, err
	}
	if cfg.Breaker.Failures == 0 || cfg.Breaker.OpenFor <= 0 {
		return nil, fmt.Errorf("%w: breaker %+v: need Failures >= 1 and OpenFor > 0", ErrInvalidConfig, cfg.Breaker)
	}
	if cfg.MaxRetryAfter == 0 {
		cfg.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if cfg.MaxRetryAfter < 0 {
		return nil, fmt.Errorf("%w: MaxRetryAfter %v: need >= 0", ErrInvalidConfig, cfg.MaxRetryAfter)
	}
	d := &Deliverer{
		timeout:   cfg.Timeout,
		maxWait:   cfg.MaxRetryAfter,
		endpoints: map[string]*url.URL{},
		secrets:   map[string][]signing.Secret{},
		dests:     map[string]*destination{},
		byPartner: map[string]*destination{},
		onState:   cfg.OnBreakerState,
	}
	dialer := &net.Dialer{Timeout: min(cfg.Timeout, 5*time.Second), KeepAlive: 30 * time.Second}
	d.client = &http.Client{
		Timeout: cfg.Timeout, // the whole exchange, body included
		Transport: &http.Transport{
			DialContext:           dialer.DialContext,
			TLSHandshakeTimeout:   min(cfg.Timeout, 5*time.Second),
			ResponseHeaderTimeout: cfg.Timeout,
			MaxIdleConns:          1024,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       90 * time.Second,
		},
		// Redirects are not followed: the answer is a failed attempt with
		// its 3xx status. Following would send the signed event to a URL
		// the operator never configured (another host, perhaps: the
		// payload leaks, and the destination's bulkhead, breaker and rate
		// limit are bypassed), and Go's client turns a POST into a GET on
		// 301/302/303. A moved endpoint is a configuration change.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	// PerDestination's keys, normalised: "https://api.example.com" is
	// "https://api.example.com:443". A key that names no partner's
	// destination is an error: it was silently ignored (a limit written
	// without the port, or for a host no partner uses, never applied).
	per := map[string]DestinationLimits{}
	for k, l := range cfg.PerDestination {
		u, err := url.Parse(k)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: PerDestination key %q: need scheme://host[:port], http or https", ErrInvalidConfig, k)
		}
		if err := l.validate(); err != nil {
			return nil, fmt.Errorf("PerDestination %q: %w", k, err)
		}
		name := destName(u)
		if prev, ok := per[name]; ok && prev != l {
			return nil, fmt.Errorf("%w: PerDestination: two different limits for %s", ErrInvalidConfig, name)
		}
		per[name] = l
	}
	for partner, raw := range cfg.Endpoints {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: partner %q: endpoint %q is not an http(s) URL", ErrInvalidConfig, partner, raw)
		}
		d.endpoints[partner] = u
		secs := cfg.Secrets[partner]
		if len(secs) == 0 || slices.ContainsFunc(secs, signing.Secret.IsZero) {
			return nil, fmt.Errorf("%w: partner %q has no signing secret", ErrInvalidConfig, partner)
		}
		d.secrets[partner] = slices.Clone(secs)
		name := destName(u)
		dst := d.dests[name]
		if dst == nil {
			lim := cfg.Limits
			if o, ok := per[name]; ok {
				lim = o
			}
			dst = &destination{
				name:     name,
				bulkhead: semaphore.NewWeighted(int64(lim.Concurrency)),
				limiter:  rate.NewLimiter(rate.Limit(lim.Rate), lim.Burst),
			}
			failures := cfg.Breaker.Failures
			dst.breaker = gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
				Name:        name,
				MaxRequests: 1,
				Timeout:     cfg.Breaker.OpenFor,
				ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= failures },
				// An endpoint answering a final 4xx is up.
				IsSuccessful: countsAsBreakerSuccess,
				// Our own refusals (rate) and a cancelled attempt say
				// nothing about the endpoint's health.
				IsExcluded: func(err error) bool {
					return errors.Is(err, ErrRateLimited) || errors.Is(err, context.Canceled)
				},
				OnStateChange: func(name string, from, to gobreaker.State) {
					if d.onState != nil {
						d.onState(name, from, to)
					}
				},
			})
			d.dests[name] = dst
		}
		d.byPartner[partner] = dst
	}
	for name := range per {
		if d.dests[name] == nil {
			known := slices.Sorted(maps.Keys(d.dests))
			return nil, fmt.Errorf("%w: PerDestination %s is no partner's destination (they are %v)", ErrInvalidConfig, name, known)
		}
	}
	return d, nil
}

func destName(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return u.Scheme + "://" + net.JoinHostPort(u.Hostname(), port)
}

// Destination returns the destination name of a partner's endpoint, "" for
// an unknown partner.
func (d *Deliverer) Destination(partner string) string {
	if d.zero() {
		return ""
	}
	if dst := d.byPartner[partner]; dst != nil {
		return dst.name
	}
	return ""
}

// BreakerState returns the state of a destination's breaker.
func (d *Deliverer) BreakerState(dest string) (gobreaker.State, bool) {
	if d.zero() {
		return 0, false
	}
	dst := d.dests[dest]
	if dst == nil {
		return 0, false
	}
	return dst.breaker.State(), true
}

// Delivery is one event to deliver.
type Delivery struct {
	Partner  string
	ID       string    // stable across attempts: the dedup key for the customer
	Received time.Time // intake time
	Body     []byte    // sent as is, Content-Type application/json
	Call     *Call     // when set, Deliver fills it with what the HTTP call returned (history.go)
}

// Deliver makes one delivery attempt: nil when the endpoint answered 2xx.
// Failures are errors wrapping ErrBulkheadFull, ErrRateLimited,
// gobreaker.ErrOpenState or ErrTooManyRequests (local refusals, no call), a
// *ResponseError (a non-2xx answer: its Outcome, status, the body's first
// bytes, a Retry-After; it wraps a *StatusError, and ErrEndpointGone for a
// 410), or the transport's error (timeouts included). Each request is
// signed (webhook-signature) with every secret of the partner. The attempt
// never takes longer than the configured Timeout plus the wait for a rate
// token (itself bounded by the same deadline).
func (d *Deliverer) Deliver(ctx context.Context, ev Delivery) error {
	if d.zero() {
		return ErrZeroDeliverer
	}
	u := d.endpoints[ev.Partner]
	dst := d.byPartner[ev.Partner]
	if u == nil || dst == nil {
		return fmt.Errorf("%w: %q", ErrUnknownPartner, ev.Partner)
	}
	// The bulkhead first, without waiting: a destination that is slow or
	// hangs holds at most its budget of workers; an attempt beyond it fails
	// now and waits out its backoff holding no worker.
	if !dst.bulkhead.TryAcquire(1) {
		return fmt.Errorf("%s: %w", dst.name, ErrBulkheadFull)
	}
	defer dst.bulkhead.Release(1)

	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	_, err := dst.breaker.Execute(func() (struct{}, error) {
		// Inside the breaker so that an open breaker spends no token;
		// a rate refusal is excluded from the breaker's counts.
		if err := dst.limiter.Wait(ctx); err != nil {
			// Not wrapped: the limiter's context error is a rate refusal
			// here, not the delivery's own cancellation.
			return struct{}{}, fmt.Errorf("%w: %v", ErrRateLimited, err) //nolint:errorlint // see above
		}
		return struct{}{}, d.post(ctx, u, ev)
	})
	if err != nil {
		return fmt.Errorf("deliver %s to %s: %w", ev.ID, dst.name, err)
	}
	return nil
}

func (d *Deliverer) post(ctx context.Context, u *url.URL, ev Delivery) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(ev.Body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "keysched-webhook/1")
	// webhook-id, webhook-timestamp (now: this attempt's time) and
	// webhook-signature.
	signing.SetHeaders(req.Header, ev.ID, time.Now(), ev.Body, d.secrets[ev.Partner]...)
	req.Header.Set(HeaderPartner, ev.Partner)
	start := time.Now()
	resp, err := d.client.Do(req)
	// What the answer means: response.go (reads and closes the body). The
	// call's status and the body's first bytes go to the attempt's record.
	r := Classify(resp, err, time.Now(), d.maxWait)
	ev.Call.record(start, r.Status, r.Body)
	return r.err()
}

// Close releases idle connections.
func (d *Deliverer) Close() {
	if d.zero() {
		return
	}
	d.client.CloseIdleConnections()
}

// zero reports a nil Deliverer or one not made by NewDeliverer.
func (d *Deliverer) zero() bool { return d == nil || d.client == nil }
