// Package signing signs and verifies webhooks as the Standard Webhooks
// specification defines them (https://www.standardwebhooks.com, the
// symmetric scheme): three headers,
//
//	webhook-id:        the event's ID, the same on every attempt (dedup key)
//	webhook-timestamp: the attempt's time, Unix seconds
//	webhook-signature: "v1,<base64 HMAC-SHA256 of id.timestamp.body>", one
//	                   per secret, separated by spaces
//
// Secrets are 24 to 64 random bytes, written "whsec_" + base64 (standard
// alphabet, padded). A sender signs with every secret of a partner during a
// rotation (the new one and the old one), so a receiver holding either
// accepts the request.
//
// The webhook delivery service signs with Sign; a receiver (in Go) checks a
// request with a Verifier, or wraps its handler in Verifier.Middleware.
// Both agree with the specification's published test vectors and with its
// reference Go library (see vectors_test.go), but for requests that library
// accepts and Verify refuses: an ID containing a '.' (ErrInvalidHeader), and
// a webhook-timestamp not written as Sign writes it ("+1614265330",
// "01614265330") with a signature of the number's plain form: that library
// signs the number it parsed, Verify the header's text.
package signing

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names (HTTP headers are case-insensitive; these are the
// specification's spelling).
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts the text form of a symmetric secret.
const SecretPrefix = "whsec_"

// Bounds of a secret's length in bytes, from the specification ("Random.
// Between 24 bytes (192 bits) and 64 bytes (512 bits)").
const (
	MinSecretBytes = 24
	MaxSecretBytes = 64
)

// DefaultTolerance is how far a request's webhook-timestamp may be from the
// receiver's clock, either way, before Verify refuses it (replay
// protection). The specification's libraries use 5 minutes.
const DefaultTolerance = 5 * time.Minute

// Errors Verify returns, wrapped with the details (errors.Is finds them).
var (
	// ErrMissingHeader: webhook-id, webhook-timestamp or webhook-signature
	// is absent or empty.
	ErrMissingHeader = errors.New("signing: missing webhook header")
	// ErrInvalidHeader: the timestamp is not a decimal number of seconds,
	// or the ID contains a '.' (the signed content id.timestamp.body would
	// be ambiguous).
	ErrInvalidHeader = errors.New("signing: invalid webhook header")
	// ErrTooOld: the timestamp is more than the tolerance in the past
	// (a replay, or a clock far behind).
	ErrTooOld = errors.New("signing: webhook timestamp too old")
	// ErrTooNew: the timestamp is more than the tolerance in the future.
	ErrTooNew = errors.New("signing: webhook timestamp too new")
	// ErrNoMatch: no v1 signature in the header matches any of the
	// verifier's secrets (a wrong secret, or a body changed on the way).
	ErrNoMatch = errors.New("signing: no matching signature")
	// ErrInvalidSecret is returned by ParseSecret and NewVerifier for a
	// secret that is not "whsec_" + base64 of 24 to 64 bytes.
	ErrInvalidSecret = errors.New("signing: invalid secret")
	// ErrBodyTooLarge is the reason Middleware refuses a body above its
	// limit.
	ErrBodyTooLarge = errors.New("signing: body too large")
)

// Secret is a symmetric signing key. Its String method does not reveal it;
// Encode gives the "whsec_" text form.
type Secret struct {
	key []byte
}

// ParseSecret parses the "whsec_" + base64 form (standard alphabet, padded;
// the prefix may be omitted, as the specification's libraries accept). The
// key must be 24 to 64 bytes. Errors wrap ErrInvalidSecret; they never
// include the secret.
func ParseSecret(s string) (Secret, error) {
	s = strings.TrimSpace(s)
	b64, prefixed := strings.CutPrefix(s, SecretPrefix)
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		if !prefixed {
			return Secret{}, fmt.Errorf("%w: does not start with %q and is not base64 either (%d characters): need %q followed by the standard base64 of %d to %d random bytes", ErrInvalidSecret, SecretPrefix, len(b64), SecretPrefix, MinSecretBytes, MaxSecretBytes)
		}
		return Secret{}, fmt.Errorf("%w: not base64 after %q (%d characters): need %q followed by the standard base64 of %d to %d random bytes", ErrInvalidSecret, SecretPrefix, len(b64), SecretPrefix, MinSecretBytes, MaxSecretBytes)
	}
	if len(key) < MinSecretBytes || len(key) > MaxSecretBytes {
		return Secret{}, fmt.Errorf("%w: %d bytes, need %d to %d (%q followed by their standard base64)", ErrInvalidSecret, len(key), MinSecretBytes, MaxSecretBytes, SecretPrefix)
	}
	return Secret{key: key}, nil
}

// NewSecret returns a fresh random 32-byte secret.
func NewSecret() (Secret, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return Secret{}, err
	}
	return Secret{key: key}, nil
}

// Encode returns the secret's "whsec_" text form: give it to the receiver.
func (s Secret) Encode() string { return SecretPrefix + base64.StdEncoding.EncodeToString(s.key) }

// String returns a redacted form, so that a Secret logged by mistake does
// not leak.
func (s Secret) String() string { return SecretPrefix + "<redacted>" }

// IsZero reports a Secret not made by ParseSecret or NewSecret.
func (s Secret) IsZero() bool { return len(s.key) == 0 }

// mac returns HMAC-SHA256(key, id.timestamp.body).
func (s Secret) mac(id, timestamp string, body []byte) []byte {
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte(id))
	h.Write([]byte{'.'})
	h.Write([]byte(timestamp))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Sign returns the webhook-signature header value for one request: "v1,"
// and the base64 signature for each secret, in the order given, separated by
// single spaces. It panics on no secret or a zero Secret (a programming
// error: the service checks its configuration at start). The id must not
// hold a '.': the signed content id.timestamp.body would be ambiguous, and
// every Verifier refuses such a request with ErrInvalidHeader (the service
// makes its own IDs, which never do).
func Sign(id string, timestamp time.Time, body []byte, secrets ...Secret) string {
	if len(secrets) == 0 {
		panic("signing: Sign without a secret")
	}
	ts := strconv.FormatInt(timestamp.Unix(), 10)
	var b strings.Builder
	for i, s := range secrets {
		if s.IsZero() {
			panic("signing: Sign with a zero Secret")
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("v1,")
		b.WriteString(base64.StdEncoding.EncodeToString(s.mac(id, ts, body)))
	}
	return b.String()
}

// SetHeaders sets the three Standard Webhooks headers on h for one attempt
// made at now.
func SetHeaders(h http.Header, id string, now time.Time, body []byte, secrets ...Secret) {
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(HeaderSignature, Sign(id, now, body, secrets...))
}

// Verifier checks requests against one or more secrets (several while the
// sender rotates: a request signed with any of them is accepted). It is
// immutable and safe for concurrent use.
type Verifier struct {
	secrets   []Secret
	tolerance time.Duration
	now       func() time.Time
	maxBody   int64
}

// Option configures a Verifier.
type Option func(*Verifier)

// WithTolerance sets how far the timestamp may be from now, either way
// (default DefaultTolerance). A tolerance <= 0 is refused by NewVerifier:
// to skip the check is to accept replays.
func WithTolerance(d time.Duration) Option { return func(v *Verifier) { v.tolerance = d } }

// WithClock sets the clock the timestamp is compared with (tests).
func WithClock(now func() time.Time) Option { return func(v *Verifier) { v.now = now } }

// WithMaxBody bounds the body Middleware reads (default 1 MiB); a larger
// body is refused with 413. n > 0; math.MaxInt64 means no bound.
func WithMaxBody(n int64) Option { return func(v *Verifier) { v.maxBody = n } }

// NewVerifier returns a Verifier for secrets in the "whsec_" form (at least
// one). Errors wrap ErrInvalidSecret (naming the secret's position, never
// its value).
func NewVerifier(secrets []string, opts ...Option) (*Verifier, error) {
	if len(secrets) == 0 {
		return nil, fmt.Errorf("%w: no secret", ErrInvalidSecret)
	}
	v := &Verifier{tolerance: DefaultTolerance, now: time.Now, maxBody: 1 << 20}
	for i, s := range secrets {
		sec, err := ParseSecret(s)
		if err != nil {
			return nil, fmt.Errorf("secret %d: %w", i, err)
		}
		v.secrets = append(v.secrets, sec)
	}
	for _, o := range opts {
		o(v)
	}
	if v.tolerance <= 0 {
		return nil, fmt.Errorf("signing: tolerance %v: need > 0", v.tolerance)
	}
	if v.maxBody <= 0 {
		return nil, fmt.Errorf("signing: max body %d: need > 0", v.maxBody)
	}
	if v.now == nil {
		v.now = time.Now
	}
	return v, nil
}

// Verify checks a request's headers and its body, exactly as received (do
// not re-encode JSON before verifying: a single changed byte fails). It
// returns nil when the timestamp is within the tolerance and one of the
// header's v1 signatures matches one of the secrets; otherwise an error
// wrapping ErrMissingHeader, ErrInvalidHeader, ErrTooOld, ErrTooNew or
// ErrNoMatch, with the reason. Signatures of other schemes (v1a, ...) are
// ignored. The comparison takes constant time per candidate signature
// (hmac.Equal).
func (v *Verifier) Verify(h http.Header, body []byte) error {
	id, ts, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	switch {
	case id == "":
		return fmt.Errorf("%w: %s", ErrMissingHeader, HeaderID)
	case ts == "":
		return fmt.Errorf("%w: %s", ErrMissingHeader, HeaderTimestamp)
	case sigs == "":
		return fmt.Errorf("%w: %s", ErrMissingHeader, HeaderSignature)
	case strings.Contains(id, "."):
		return fmt.Errorf("%w: %s contains '.'", ErrInvalidHeader, HeaderID)
	}
	sec, err := parseTimestamp(ts)
	if err != nil {
		return err
	}
	now := v.now()
	at := time.Unix(sec, 0)
	if d := now.Sub(at); d > v.tolerance {
		return fmt.Errorf("%w: %s %s is %v before now (%s), tolerance %v", ErrTooOld, HeaderTimestamp, ts,
			ceilMillis(d), now.UTC().Format(time.RFC3339Nano), v.tolerance)
	}
	if d := at.Sub(now); d > v.tolerance {
		return fmt.Errorf("%w: %s %s is %v after now (%s), tolerance %v", ErrTooNew, HeaderTimestamp, ts,
			ceilMillis(d), now.UTC().Format(time.RFC3339Nano), v.tolerance)
	}
	want := make([][]byte, len(v.secrets))
	for i, s := range v.secrets {
		want[i] = s.mac(id, ts, body)
	}
	seen := 0
	for _, f := range strings.Fields(sigs) {
		version, sig, ok := strings.Cut(f, ",")
		if !ok || version != "v1" {
			continue
		}
		seen++
		got, err := base64.StdEncoding.DecodeString(sig)
		if err != nil {
			continue
		}
		for _, w := range want {
			if hmac.Equal(got, w) {
				return nil
			}
		}
	}
	if seen == 0 {
		return fmt.Errorf("%w: no v1 signature in %s", ErrNoMatch, HeaderSignature)
	}
	return fmt.Errorf("%w: %d v1 signatures, %d secrets", ErrNoMatch, seen, len(v.secrets))
}

// ceilMillis rounds d up to the millisecond, for a refusal's text: the
// clock has sub-second precision and the timestamp has not, so an offset
// just past the tolerance, truncated, read as the tolerance itself ("is
// 5m0s after now, tolerance 5m0s"); rounded up it reads as more.
func ceilMillis(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d
}

// parseTimestamp accepts decimal digits only: the signature covers the
// header's text, and "+1614265330" or " 1614265330" would parse to the same
// number yet sign differently.
func parseTimestamp(ts string) (int64, error) {
	if len(ts) > 18 || strings.TrimLeft(ts, "0123456789") != "" {
		return 0, fmt.Errorf("%w: %s %q: need Unix seconds, decimal digits only", ErrInvalidHeader, HeaderTimestamp, ts)
	}
	n, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s %q: %w", ErrInvalidHeader, HeaderTimestamp, ts, err)
	}
	return n, nil
}

// Middleware verifies each request before next sees it: it reads the body
// (at most the WithMaxBody limit: 413 beyond), verifies it, and on failure
// answers 401 with the reason as plain text (the reason names what is wrong,
// never a secret or the expected signature); on success it hands next the
// request with its body restored. A 401 is what the Standard Webhooks
// sender of this repository treats as permanent for the event (see the
// service's README): a receiver that cannot verify should not be retried
// for ever.
func (v *Verifier) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// One byte past the limit tells a body above it; maxBody+1 would
		// wrap negative at math.MaxInt64 and read nothing at all.
		limit := v.maxBody
		if limit < math.MaxInt64 {
			limit++
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, limit))
		if err != nil {
			http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if int64(len(body)) > v.maxBody {
			http.Error(w, fmt.Sprintf("%v: above %d bytes", ErrBodyTooLarge, v.maxBody), http.StatusRequestEntityTooLarge)
			return
		}
		if err := v.Verify(r.Header, body); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}
