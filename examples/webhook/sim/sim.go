// Package sim simulates customer webhook endpoints on loopback: slow ones,
// flaky ones, hanging ones, ones that are down and come back. Every endpoint
// records what it accepted, per partner, so tests and the load generator can
// check order and measure latency.
package sim

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/keysched/keysched/examples/webhook/signing"
)

// Header names the endpoints read (the service's delivery headers).
const (
	headerID      = "Webhook-Id"
	headerPartner = "Webhook-Partner"
)

// Behavior is how an endpoint answers. The zero value answers 204 at once.
type Behavior struct {
	Delay    time.Duration // every request takes this long before answering
	FailRate float64       // fraction of requests answered 500 (0..1)
	Hang     bool          // requests block until the caller gives up (or Hang is cleared)
	Down     bool          // every request answered 503
	// Throttle, when > 0, answers every request 429 with "Retry-After:"
	// this many seconds (a partner asking the sender to slow down).
	Throttle int
}

// Delivery is one request an endpoint answered with a 2xx.
type Delivery struct {
	Partner string
	ID      string
	At      time.Time
	Body    []byte // passed to OnDelivery only; the recorder keeps IDs
}

// Recorder keeps, per partner, the IDs endpoints accepted, in arrival order
// (duplicates included), and holds each partner's signing secrets: an
// endpoint verifies every request's Standard Webhooks signature (package
// signing) before anything else, and answers 401, counted in BadSignatures,
// when it fails or when the partner has no secret here. Register secrets
// with NewSecret or AddSecrets before the service delivers. Safe for
// concurrent use.
type Recorder struct {
	mu        sync.Mutex
	byP       map[string][]string
	total     int
	attempts  int
	verifiers map[string]*signing.Verifier
	badSigs   int
	lastBad   string
	inFlight  map[string]int // partner -> requests being answered now
	overlaps  map[string]int // partner -> requests that began while another was in flight
	// OnDelivery, when set before use, is called for every accepted request
	// (with the recorder's lock not held).
	OnDelivery func(Delivery)
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{byP: map[string][]string{}, verifiers: map[string]*signing.Verifier{},
		inFlight: map[string]int{}, overlaps: map[string]int{}}
}

// NewSecret makes a fresh signing secret for partner, makes the endpoints
// accept it (only it) for that partner, and returns its "whsec_" form for
// the service's configuration.
func (r *Recorder) NewSecret(partner string) (string, error) {
	s, err := signing.NewSecret()
	if err != nil {
		return "", err
	}
	return s.Encode(), r.AddSecrets(partner, s.Encode())
}

// AddSecrets sets the secrets ("whsec_" form) the endpoints accept for
// partner (a receiver rotating holds the old and the new one).
func (r *Recorder) AddSecrets(partner string, secrets ...string) error {
	v, err := signing.NewVerifier(secrets)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.verifiers[partner] = v
	r.mu.Unlock()
	return nil
}

// Overlaps returns how many requests for partner began while another
// request for the same partner was being answered (by any endpoint of this
// recorder): a sender that delivers one partner's events one at a time
// makes none.
func (r *Recorder) Overlaps(partner string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.overlaps[partner]
}

func (r *Recorder) begin(partner string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inFlight[partner] > 0 {
		r.overlaps[partner]++
	}
	r.inFlight[partner]++
}

func (r *Recorder) end(partner string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inFlight[partner]--
}

// BadSignatures returns how many requests failed verification (401) and the
// last one's reason.
func (r *Recorder) BadSignatures() (n int, last string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.badSigs, r.lastBad
}

// verify checks a request's signature against partner's secrets.
func (r *Recorder) verify(partner string, h http.Header, body []byte) error {
	r.mu.Lock()
	v := r.verifiers[partner]
	r.mu.Unlock()
	err := errors.New("sim: no signing secret for partner " + partner)
	if v != nil {
		err = v.Verify(h, body)
	}
	if err != nil {
		r.mu.Lock()
		r.badSigs++
		r.lastBad = err.Error()
		r.mu.Unlock()
	}
	return err
}

func (r *Recorder) record(d Delivery) {
	r.mu.Lock()
	r.byP[d.Partner] = append(r.byP[d.Partner], d.ID)
	r.total++
	r.mu.Unlock()
	if r.OnDelivery != nil {
		r.OnDelivery(d)
	}
}

func (r *Recorder) attempt() {
	r.mu.Lock()
	r.attempts++
	r.mu.Unlock()
}

// IDs returns a copy of the IDs accepted for partner, in arrival order.
func (r *Recorder) IDs(partner string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.byP[partner]...)
}

// Total returns the number of accepted requests (duplicates included) and of
// requests received at all.
func (r *Recorder) Total() (accepted, received int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total, r.attempts
}

// Endpoint is one customer's HTTP endpoint on 127.0.0.1, its own listener
// (so its own destination for the service's bulkheads and breakers).
type Endpoint struct {
	URL string

	rec  *Recorder
	srv  *http.Server
	mu   sync.Mutex
	b    Behavior
	hang chan struct{} // closed when Hang is cleared
	done chan struct{}
}

// NewEndpoint starts an endpoint answering with b, recording into rec.
// Requests go to its URL (any path).
func NewEndpoint(rec *Recorder, b Behavior) (*Endpoint, error) {
	if rec == nil {
		return nil, errors.New("sim: nil recorder")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	e := &Endpoint{URL: "http://" + ln.Addr().String() + "/hook", rec: rec, b: b, hang: make(chan struct{}), done: make(chan struct{})}
	e.srv = &http.Server{Handler: e, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = e.srv.Serve(ln) }()
	return e, nil
}

// Set changes the behaviour for the requests that arrive from now on;
// clearing Hang releases the requests hanging now (they answer 503).
func (e *Endpoint) Set(b Behavior) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.b.Hang && !b.Hang {
		close(e.hang)
		e.hang = make(chan struct{})
	}
	e.b = b
}

// Behavior returns the current behaviour.
func (e *Endpoint) Behavior() Behavior {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.b
}

func (e *Endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.rec.attempt()
	e.mu.Lock()
	b, hang := e.b, e.hang
	e.mu.Unlock()
	id, partner := r.Header.Get(headerID), r.Header.Get(headerPartner)
	if id == "" || partner == "" {
		http.Error(w, "missing Webhook-Id or Webhook-Partner", http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if err := e.rec.verify(partner, r.Header, body); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	e.rec.begin(partner)
	defer e.rec.end(partner)
	if b.Hang {
		select {
		case <-r.Context().Done():
		case <-hang:
		case <-e.done:
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if b.Delay > 0 {
		t := time.NewTimer(b.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		case <-e.done:
			t.Stop()
			return
		}
	}
	if b.Down {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if b.Throttle > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(b.Throttle))
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	if b.FailRate > 0 && rand.Float64() < b.FailRate {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	// Record before answering: a delivery the service counts as done has
	// been seen here (the reverse, a recorded delivery whose answer the
	// service never saw, is the duplicate the contract allows).
	e.rec.record(Delivery{Partner: partner, ID: id, At: time.Now(), Body: body})
	w.WriteHeader(http.StatusNoContent)
}

// Close stops the endpoint, releasing hanging requests.
func (e *Endpoint) Close() error {
	close(e.done)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := e.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return e.srv.Close()
	}
	return err
}

// CheckOrder checks one partner's received IDs against the order the
// service accepted them in: every accepted ID arrived, and the first
// arrivals of the IDs are in accepted order. Duplicates (redeliveries) are
// allowed anywhere after an ID's first arrival. It returns the number of
// duplicates, or an error describing the first violation.
func CheckOrder(accepted, received []string) (dups int, err error) {
	pos := make(map[string]int, len(accepted))
	for i, id := range accepted {
		pos[id] = i
	}
	seen := make(map[string]bool, len(accepted))
	next := 0
	for _, id := range received {
		i, ok := pos[id]
		if !ok {
			return dups, &OrderError{Msg: "received an ID that was never accepted", ID: id}
		}
		if seen[id] {
			dups++
			continue
		}
		if i != next {
			return dups, &OrderError{Msg: "first arrival out of order", ID: id, Want: accepted[next]}
		}
		seen[id] = true
		next++
	}
	if next != len(accepted) {
		return dups, &OrderError{Msg: "accepted events never delivered", ID: accepted[next], Missing: len(accepted) - next}
	}
	return dups, nil
}

// OrderError describes a violation found by CheckOrder.
type OrderError struct {
	Msg     string
	ID      string // the offending (or first missing) ID
	Want    string // the ID expected instead, for an out-of-order arrival
	Missing int    // how many accepted IDs never arrived
}

func (e *OrderError) Error() string {
	s := "sim: " + e.Msg + ": " + e.ID
	if e.Want != "" {
		s += " (expected " + e.Want + ")"
	}
	if e.Missing > 0 {
		s += " and later ones"
	}
	return s
}
