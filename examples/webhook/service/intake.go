package service

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// MaxBodyBytes bounds an intake request's body.
const MaxBodyBytes = 256 << 10

var (
	partnerRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	typeRe    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)
)

// IntakeRequest is the body partners POST to /events/{partner}:
//
//	{"type": "order.created", "data": {...}}
//
// type is 1 to 128 characters of letters, digits and ._:/- ; data is a JSON
// object. Unknown fields are an error.
type IntakeRequest struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"`
}

// Envelope is what the customer endpoint receives (the body of every
// delivery of one event, byte for byte the same on every attempt).
type Envelope struct {
	ID       string          `json:"id"`
	Partner  string          `json:"partner"`
	Type     string          `json:"type"`
	Received time.Time       `json:"received_at"`
	Data     json.RawMessage `json:"data"`
}

// IntakeResponse is the 202 body.
type IntakeResponse struct {
	ID string `json:"id"`
}

type errorBody struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// parseIntake checks the body's shape.
func parseIntake(r *http.Request, w http.ResponseWriter) (IntakeRequest, int, error) {
	var req IntakeRequest
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return req, http.StatusUnsupportedMediaType, fmt.Errorf("Content-Type %q: need application/json", ct)
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return req, http.StatusRequestEntityTooLarge, fmt.Errorf("body over %d bytes", MaxBodyBytes)
		}
		return req, http.StatusBadRequest, fmt.Errorf("reading body: %w", err)
	}
	// JSON text is UTF-8 (RFC 8259 section 8.1). encoding/json accepts
	// invalid bytes inside strings, and data is forwarded byte for byte: an
	// event with them would reach the customer as a body its JSON parser
	// rejects, on every attempt, until the partner is parked (a poison
	// event). Refuse it here, where the partner can still fix it.
	if !utf8.Valid(body) {
		return req, http.StatusBadRequest, errors.New("body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, http.StatusBadRequest, fmt.Errorf("body: need one JSON object %s: %s", intakeShape, jsonReason(err))
	}
	// Only white space may follow the object. (dec.More does not say so: it
	// is false before a stray ']' or '}', and such a body was accepted.)
	if _, err := dec.Token(); err != io.EOF {
		return req, http.StatusBadRequest, errors.New("body has data after the JSON object")
	}
	if !typeRe.MatchString(req.Type) {
		return req, http.StatusBadRequest, fmt.Errorf("type %q: need 1 to 128 of [A-Za-z0-9._:/-]", req.Type)
	}
	if d := bytes.TrimSpace(req.Data); len(d) == 0 || d[0] != '{' {
		return req, http.StatusBadRequest, errors.New("data: need a JSON object")
	}
	return req, 0, nil
}

// intakeShape is the body intake wants, as its errors say.
const intakeShape = `{"type":"...","data":{...}}`

// jsonReason says why an intake body did not decode, in JSON's terms (the
// decoder's type errors named the Go type: "cannot unmarshal array into Go
// value of type service.IntakeRequest").
func jsonReason(err error) string {
	var ute *json.UnmarshalTypeError
	switch {
	case errors.As(err, &ute) && ute.Field == "":
		return "got a JSON " + ute.Value
	case errors.As(err, &ute):
		return fmt.Sprintf("field %q: got a JSON %s", ute.Field, ute.Value)
	case errors.Is(err, io.EOF):
		return "the body is empty"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "the JSON ends early"
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// handleIntake is POST /events/{partner}. It runs one short database
// transaction (the outbox row and the intake record) and nothing else: no
// call to the partner's endpoint, no wait for the scheduler.
func (s *Service) handleIntake(w http.ResponseWriter, r *http.Request) {
	partner := r.PathValue("partner")
	if !partnerRe.MatchString(partner) || !s.known(partner) {
		writeJSON(w, http.StatusNotFound, errorBody{fmt.Sprintf("unknown partner %q", partner)})
		return
	}
	req, code, err := parseIntake(r, w)
	if err != nil {
		writeJSON(w, code, errorBody{err.Error()})
		return
	}
	if !s.backlog.reserve(partner) {
		// Backpressure on this partner only.
		secs := int(math.Ceil(s.cfg.RetryAfter.Seconds()))
		w.Header().Set("Retry-After", strconv.Itoa(max(1, secs)))
		s.metrics.rejected(r.Context(), partner)
		writeJSON(w, http.StatusTooManyRequests, errorBody{fmt.Sprintf("partner %q has %d undelivered events (the bound); retry later", partner, s.cfg.MaxBacklog)})
		return
	}
	id, err := uuid.NewV7()
	if err != nil {
		s.backlog.release(partner)
		writeJSON(w, http.StatusInternalServerError, errorBody{"cannot make an event ID"})
		return
	}
	env := Envelope{ID: id.String(), Partner: partner, Type: req.Type, Received: s.now().UTC(), Data: req.Data}
	payload, err := json.Marshal(env)
	if err != nil { // Data was checked as JSON already
		s.backlog.release(partner)
		writeJSON(w, http.StatusBadRequest, errorBody{err.Error()})
		return
	}
	s.backlog.commit(partner, env.ID, env.Received)
	if taken, err := s.commit.accept(r.Context(), env, payload); err != nil {
		if !taken {
			s.backlog.drop(partner, env.ID)
		}
		if errors.Is(err, ErrClosed) {
			writeJSON(w, http.StatusServiceUnavailable, errorBody{"the service is shutting down; retry"})
			return
		}
		s.log.Error("intake: persisting an event failed", "partner", partner, "err", err)
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, errorBody{"could not persist the event; retry"})
		return
	}
	writeJSON(w, http.StatusAccepted, IntakeResponse{ID: env.ID})
}
