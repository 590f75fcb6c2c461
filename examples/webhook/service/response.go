package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/keysched/keysched"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Outcome is what one delivery attempt's answer means (the README's table,
// "What a response means").
type Outcome int

const (
	// Delivered: a 2xx. The event is done.
	Delivered Outcome = iota
	// Retry: a failed attempt, counted against Retry.MaxAttempts and
	// retried after the policy's backoff (full jitter): 408, 425, 429 and
	// 503 without a usable Retry-After, any other 5xx, a redirect (3xx,
	// not followed), any other status outside 2xx and 4xx, a timeout, a
	// connection error.
	Retry
	// SnoozeUntil: 429 or 503 with a Retry-After (seconds or an HTTP date):
	// the event is not sent again before then (capped by
	// Config.MaxRetryAfter), and the wait spends no attempt
	// (keysched.Snooze).
	SnoozeUntil
	// Permanent: any other 4xx (400, 401, 403, 404, 405, 409, 413, 422...):
	// the partner will never accept this request, so it is not retried
	// (keysched.Permanent): the event is dead at once, its error naming the
	// status and the first bytes of the answer, and the partner parks.
	Permanent
	// Gone: 410. The endpoint is disabled: the event is dead at once and
	// the partner parks with the reason "endpoint gone" (no call until an
	// operator resumes it), logged and counted (webhook.deliveries with
	// result="gone").
	Gone
)

func (o Outcome) String() string {
	switch o {
	case Delivered:
		return "delivered"
	case Retry:
		return "retry"
	case SnoozeUntil:
		return "snooze"
	case Permanent:
		return "permanent"
	case Gone:
		return "gone"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Bounds of what a response's classification keeps and reads.
const (
	// BodyPrefixBytes is how much of a non-2xx answer's body is kept in
	// its error (and so in a dead event's record).
	BodyPrefixBytes = 256
	// drainBytes bounds what is read of a body so that the connection can
	// be reused; a longer body is cut (the connection is then closed).
	drainBytes = 64 << 10
	// DefaultMaxRetryAfter is Config.MaxRetryAfter's default.
	DefaultMaxRetryAfter = 10 * time.Minute
)

// ErrEndpointGone is wrapped by the error of an attempt answered 410 Gone:
// the partner is parked with the reason "endpoint gone".
var ErrEndpointGone = errors.New("webhook: endpoint gone")

// Response is the classification of one attempt: its Outcome, the HTTP
// status (0 when no answer came: a transport error or a timeout), the first
// BodyPrefixBytes of the answer's body, the wait a Retry-After asked for
// (SnoozeUntil only, already capped), and the transport error if any.
type Response struct {
	Outcome    Outcome
	Status     int
	Body       []byte
	RetryAfter time.Duration
	Err        error
}

// Classify turns one attempt's result (the answer, or the client's error)
// into a Response. It reads (at most 64 KiB) and closes resp's body. now is
// the time a Retry-After date is counted from; maxWait caps a Retry-After
// (a partner cannot put itself to sleep for a year: the wait is cut to
// maxWait, and the event is tried then).
func Classify(resp *http.Response, err error, now time.Time, maxWait time.Duration) Response {
	if err != nil {
		if resp != nil && resp.Body != nil {
			_ = resp.Body.Close()
		}
		return Response{Outcome: Retry, Err: err}
	}
	body := make([]byte, 0, BodyPrefixBytes)
	if resp.Body != nil {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, BodyPrefixBytes))
		body = append(body, b...)
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainBytes))
		_ = resp.Body.Close()
	}
	r := Response{Status: resp.StatusCode, Body: body}
	code := resp.StatusCode
	switch {
	case code >= 200 && code <= 299:
		r.Outcome = Delivered
	case code == http.StatusGone:
		r.Outcome = Gone
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		r.Outcome = Retry
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), now); ok {
			r.Outcome, r.RetryAfter = SnoozeUntil, min(d, maxWait)
		}
	case code == http.StatusRequestTimeout || code == http.StatusTooEarly:
		r.Outcome = Retry
	case code >= 400 && code <= 499:
		r.Outcome = Permanent
	default: // 1xx left by the client, 3xx (not followed), 5xx, nonsense
		r.Outcome = Retry
	}
	return r
}

// parseRetryAfter reads a Retry-After header: delay-seconds (digits only)
// or an HTTP date (RFC 9110 section 10.2.3). A date in the past, or 0, is a
// wait of 0 (the retry policy's first, jittered, delay then applies). A
// missing or malformed header is not ok: the answer is then a normal retry.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if strings.TrimLeft(v, "0123456789") == "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > int64(365*24*time.Hour/time.Second) {
			// Beyond any cap: a year stands for it.
			return 365 * 24 * time.Hour, true
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(0, t.Sub(now)), true
}

// ResponseError is the error of an attempt the endpoint answered with a
// non-2xx status. Retrieve it with errors.As (a *StatusError is inside it).
// Its text names the status and quotes the body's first bytes (escaped: it
// is safe to log and to store).
type ResponseError struct {
	Response
}

func (e *ResponseError) Error() string {
	var b strings.Builder
	if e.Outcome == Gone {
		b.WriteString("endpoint gone: ")
	}
	fmt.Fprintf(&b, "webhook: endpoint answered %d %s", e.Status, http.StatusText(e.Status))
	if e.Outcome == SnoozeUntil {
		fmt.Fprintf(&b, retryAfterMark+"%v)", e.RetryAfter)
	}
	if len(e.Body) > 0 {
		fmt.Fprintf(&b, ": %q", e.Body)
		if len(e.Body) == BodyPrefixBytes {
			b.WriteString("...")
		}
	}
	if e.Outcome == Permanent && (e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden) {
		b.WriteString(" (a receiver whose signature check fails answers so: check that the partner's signing secret, -secrets-file, is the receiver's, then Resume)")
	}
	return b.String()
}

// retryAfterMark follows the status in a deferring answer's error (a 429
// or 503 with Retry-After): the attempt history reads it back (deferred).
const retryAfterMark = " (Retry-After: not before "

// deferredError reports whether a recorded attempt's status and error are
// a deferring answer's: not an attempt spent (SnoozeUntil).
func deferredError(status int, errText string) bool {
	if status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable {
		return false
	}
	// The first "endpoint answered" is the answer's own: the body, the
	// partner's text, is quoted after it and may hold anything (a
	// deferring answer's words too).
	const answered = "endpoint answered "
	i := strings.Index(errText, answered)
	return i >= 0 && strings.HasPrefix(errText[i:], fmt.Sprintf("%s%d %s%s", answered, status, http.StatusText(status), retryAfterMark))
}

// Unwrap gives the *StatusError (errors.As) and, for a 410, ErrEndpointGone.
func (e *ResponseError) Unwrap() []error {
	errs := []error{&StatusError{Code: e.Status}}
	if e.Outcome == Gone {
		errs = append(errs, ErrEndpointGone)
	}
	return errs
}

// err returns the attempt's error: nil when delivered, the transport error,
// or a *ResponseError.
func (r Response) err() error {
	switch {
	case r.Outcome == Delivered:
		return nil
	case r.Err != nil:
		return r.Err
	}
	return &ResponseError{Response: r}
}

// responseOf finds the classification in an attempt's error (a transport
// error, without one, is a Retry).
func responseOf(err error) (Response, bool) {
	var re *ResponseError
	if errors.As(err, &re) {
		return re.Response, true
	}
	return Response{}, false
}

// countsAsBreakerSuccess tells the destination's circuit breaker which answers say
// the destination is unhealthy: the endpoint answering 4xx (Permanent, Gone)
// is up, so those count as successes; everything else that failed counts.
func countsAsBreakerSuccess(err error) bool {
	if err == nil {
		return true
	}
	r, ok := responseOf(err)
	return ok && (r.Outcome == Permanent || r.Outcome == Gone)
}

// forRelay turns a failed attempt's error into what the relay acts on:
// keysched.Snooze for a Retry-After (no attempt spent), keysched.Permanent
// for a 4xx that is final (the event is dead at once; under Park the
// partner parks), the error as is for a retry. It records the attempt's
// result in the metrics and logs a 410.
func (s *Service) forRelay(ctx context.Context, partner, id string, err error) error {
	r, ok := responseOf(err)
	if !ok {
		s.backlog.failedAttempt(partner, err)
		s.metrics.failed(ctx, partner)
		return err
	}
	if r.Outcome != SnoozeUntil {
		s.backlog.failedAttempt(partner, err)
	}
	switch r.Outcome {
	case SnoozeUntil:
		s.metrics.result(ctx, partner, attrDeferred)
		s.log.Info("endpoint asked to wait (Retry-After): not an attempt", "partner", partner, "event", id,
			"status", r.Status, "wait", r.RetryAfter)
		return keysched.Snooze(err, r.RetryAfter)
	case Gone:
		s.metrics.result(ctx, partner, attrGone)
		s.log.Warn("endpoint gone (410): partner parks until an operator resumes it", "partner", partner, "event", id,
			slog.String("body", string(r.Body)))
		return keysched.Permanent(err)
	case Permanent:
		s.metrics.result(ctx, partner, attrPermanent)
		return keysched.Permanent(err)
	}
	s.metrics.failed(ctx, partner)
	return err
}

var (
	attrDeferred  = attribute.String("result", "deferred")
	attrPermanent = attribute.String("result", "permanent")
	attrGone      = attribute.String("result", "gone")
)

func (m *metrics) result(ctx context.Context, partner string, result attribute.KeyValue) {
	m.deliveries.Add(ctx, 1, metric.WithAttributes(partnerAttr(partner), result))
}
