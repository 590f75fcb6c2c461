package service

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
)

// Every row of the README's table "What a response means", each against a
// real HTTP endpoint on loopback, through the Deliverer's own client (so
// redirects, timeouts and connection errors are the real ones).
func TestEveryAnswerIsClassifiedAsTheTableSays(t *testing.T) {
	now := time.Now()
	const maxWait = time.Minute
	date := func(d time.Duration) string { return now.Add(d).UTC().Format(http.TimeFormat) }
	redirected := atomic.Int32{}
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		redirected.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer target.Close()
	rows := []struct {
		name    string
		status  int
		header  map[string]string
		body    string
		want    Outcome
		wait    time.Duration // SnoozeUntil: the wait, to the second
		minWait time.Duration // an HTTP date: at least this (the date has second precision)
	}{
		{name: "200", status: 200, want: Delivered},
		{name: "202", status: 202, want: Delivered},
		{name: "204", status: 204, want: Delivered},
		{name: "410 Gone", status: 410, body: "endpoint disabled", want: Gone},
		{name: "429 Retry-After seconds", status: 429, header: map[string]string{"Retry-After": "7"}, want: SnoozeUntil, wait: 7 * time.Second},
		{name: "503 Retry-After seconds", status: 503, header: map[string]string{"Retry-After": "2"}, want: SnoozeUntil, wait: 2 * time.Second},
		{name: "429 Retry-After HTTP date", status: 429, header: map[string]string{"Retry-After": date(30 * time.Second)}, want: SnoozeUntil, minWait: 29 * time.Second},
		{name: "503 Retry-After HTTP date in the past", status: 503, header: map[string]string{"Retry-After": date(-time.Hour)}, want: SnoozeUntil, wait: 0},
		{name: "429 Retry-After above the cap", status: 429, header: map[string]string{"Retry-After": "31536000"}, want: SnoozeUntil, wait: maxWait},
		{name: "429 Retry-After absurd", status: 429, header: map[string]string{"Retry-After": "99999999999999999999999"}, want: SnoozeUntil, wait: maxWait},
		{name: "503 Retry-After date above the cap", status: 503, header: map[string]string{"Retry-After": date(48 * time.Hour)}, want: SnoozeUntil, wait: maxWait},
		{name: "429 without Retry-After", status: 429, want: Retry},
		{name: "503 without Retry-After", status: 503, want: Retry},
		{name: "429 malformed Retry-After", status: 429, header: map[string]string{"Retry-After": "soon"}, want: Retry},
		{name: "429 negative Retry-After", status: 429, header: map[string]string{"Retry-After": "-5"}, want: Retry},
		{name: "408", status: 408, want: Retry},
		{name: "425", status: 425, want: Retry},
		{name: "500", status: 500, want: Retry},
		{name: "502", status: 502, want: Retry},
		{name: "504", status: 504, want: Retry},
		{name: "500 with Retry-After (not honoured: only 429/503)", status: 500, header: map[string]string{"Retry-After": "5"}, want: Retry},
		{name: "400", status: 400, body: `{"error":"field x is required"}`, want: Permanent},
		{name: "401", status: 401, body: "signature mismatch", want: Permanent},
		{name: "403", status: 403, want: Permanent},
		{name: "404", status: 404, want: Permanent},
		{name: "405", status: 405, want: Permanent},
		{name: "413", status: 413, want: Permanent},
		{name: "422", status: 422, want: Permanent},
		{name: "301 not followed", status: 301, header: map[string]string{"Location": target.URL}, want: Retry},
		{name: "302 not followed", status: 302, header: map[string]string{"Location": target.URL}, want: Retry},
		{name: "307 not followed", status: 307, header: map[string]string{"Location": target.URL}, want: Retry},
		{name: "308 not followed", status: 308, header: map[string]string{"Location": target.URL}, want: Retry},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range row.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(row.status)
				_, _ = io.WriteString(w, row.body)
			}))
			defer srv.Close()
			d := testDeliverer(t, nil, map[string]string{"p": srv.URL}, func(c *DelivererConfig) { c.MaxRetryAfter = maxWait })
			err := d.Deliver(t.Context(), Delivery{Partner: "p", ID: "evt-1", Received: now, Body: []byte(`{}`)})
			if row.want == Delivered {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			r, ok := responseOf(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, row.want, r.Outcome, "%v", err)
			require.Equal(t, row.status, r.Status)
			require.Contains(t, err.Error(), fmt.Sprint(row.status), "the error names the status")
			if row.body != "" {
				require.Equal(t, row.body, string(r.Body))
				require.Contains(t, err.Error(), fmt.Sprintf("%q", row.body), "the error quotes the body's first bytes")
			}
			if row.want == SnoozeUntil {
				if row.minWait > 0 {
					// Less what a loaded machine spends between building the
					// table's date and the answer (a new user's run: 28.99 s).
					require.GreaterOrEqual(t, r.RetryAfter, row.minWait-10*time.Second)
					require.LessOrEqual(t, r.RetryAfter, row.minWait+2*time.Second)
				} else {
					require.Equal(t, row.wait, r.RetryAfter)
				}
			}
			if row.want == Gone {
				require.ErrorIs(t, err, ErrEndpointGone)
				require.Contains(t, err.Error(), "endpoint gone")
			}
		})
	}
	require.Zero(t, redirected.Load(), "a redirect was followed")

	t.Run("timeout", func(t *testing.T) {
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		defer srv.Close()
		defer close(release)
		d := testDeliverer(t, nil, map[string]string{"p": srv.URL}, func(c *DelivererConfig) { c.Timeout = 100 * time.Millisecond })
		err := d.Deliver(t.Context(), Delivery{Partner: "p", ID: "evt-1", Received: now, Body: []byte(`{}`)})
		require.Error(t, err)
		_, isAnswer := responseOf(err)
		require.False(t, isAnswer, "a timeout is no answer: a Retry")
		require.False(t, keysched.IsPermanent(err))
	})
	t.Run("connection refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close())
		d := testDeliverer(t, nil, map[string]string{"p": "http://" + addr + "/hook"}, nil)
		err = d.Deliver(t.Context(), Delivery{Partner: "p", ID: "evt-1", Received: now, Body: []byte(`{}`)})
		require.ErrorContains(t, err, "refused")
		_, isAnswer := responseOf(err)
		require.False(t, isAnswer)
	})
	t.Run("a long body is cut and quoted safely", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(400)
			_, _ = w.Write(append([]byte("\x00\xff\n"), bytes.Repeat([]byte("y"), 100_000)...))
		}))
		defer srv.Close()
		d := testDeliverer(t, nil, map[string]string{"p": srv.URL}, nil)
		err := d.Deliver(t.Context(), Delivery{Partner: "p", ID: "evt-1", Received: now, Body: []byte(`{}`)})
		r, ok := responseOf(err)
		require.True(t, ok)
		require.Len(t, r.Body, BodyPrefixBytes)
		require.Contains(t, err.Error(), `"\x00\xff\n`)
		require.NotContains(t, err.Error(), "\x00", "no NUL in an error stored in the database")
	})
}

// answering is an endpoint on loopback answering from a script, one answer
// per call (the last repeats), recording when each call came.
type answering struct {
	srv     *httptest.Server
	mu      sync.Mutex
	answers []func(http.ResponseWriter)
	calls   []time.Time
}

func newAnswering(t *testing.T, answers ...func(http.ResponseWriter)) *answering {
	s := &answering{answers: answers}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		n := len(s.calls)
		s.calls = append(s.calls, time.Now())
		a := s.answers[min(n, len(s.answers)-1)]
		s.mu.Unlock()
		a(w)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *answering) callTimes() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.calls...)
}

func answer(code int, header ...string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
		if code >= 400 {
			_, _ = fmt.Fprintf(w, "answer %d", code)
		}
	}
}

// 410 Gone parks the partner at once with the reason "endpoint gone" (one
// call, whatever the attempt budget); no call follows until an operator
// resumes it; it is logged and counted.
func TestGoneParksPartnerUntilResumed(t *testing.T) {
	ep := newAnswering(t, answer(410), answer(204))
	logs := &syncBuffer{}
	h := newHarness(t, map[string]sim.Behavior{"ok": {}}, func(c *Config) {
		c.Partners["p"] = ep.srv.URL
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	_, first := h.post("p", 0)
	h.post("p", 1)
	require.Eventually(t, func() bool { return len(h.parked()) == 1 }, waitLong, 5*time.Millisecond)
	require.Equal(t, []string{"p"}, h.parked())
	dead, err := h.store.Outbox().Dead(t.Context(), 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, first, dead[0].ID)
	require.Contains(t, dead[0].Err, "endpoint gone")
	require.Contains(t, dead[0].Err, "410")
	require.Contains(t, h.status("p").LastError, "endpoint gone")
	require.Contains(t, logs.String(), "endpoint gone (410)")
	time.Sleep(200 * time.Millisecond) // 40 backoffs of quickConfig's policy: nothing may call
	require.Len(t, ep.callTimes(), 1, "a gone endpoint was called again before an operator resumed it")
	// The other partner goes on meanwhile.
	h.post("ok", 0)
	require.Eventually(t, func() bool { return h.delivered("ok") }, waitLong, 5*time.Millisecond)

	require.NoError(t, h.svc.Resume(t.Context(), "p"))
	require.Eventually(t, func() bool { return len(ep.callTimes()) == 3 }, waitLong, 5*time.Millisecond)
	require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond)
	require.Empty(t, h.parked())
}

// A 429 (or 503) with Retry-After: the next call comes no sooner than asked
// (here 1 s), and the wait spends no attempt: with a budget of ONE attempt
// the event is still delivered (a counted failure would have parked it).
// Without the header the same answer is a counted failure: it parks.
func TestRetryAfterDefersWithoutSpendingAnAttempt(t *testing.T) {
	ep := newAnswering(t, answer(429, "Retry-After", "1"), answer(503, "Retry-After", "1"), answer(204))
	bare := newAnswering(t, answer(429), answer(204))
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) {
		c.Partners["p"] = ep.srv.URL
		c.Partners["bare"] = bare.srv.URL
		c.Retry = keysched.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	})
	h.post("p", 0)
	h.post("bare", 0)
	require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond)
	calls := ep.callTimes()
	require.Len(t, calls, 3)
	for i := 1; i < len(calls); i++ {
		require.GreaterOrEqual(t, calls[i].Sub(calls[i-1]), time.Second, "call %d came before the Retry-After", i)
	}
	require.Eventually(t, func() bool { return len(h.parked()) == 1 }, waitLong, 5*time.Millisecond)
	require.Equal(t, []string{"bare"}, h.parked(), "a 429 without Retry-After is a counted failure")
	require.Len(t, bare.callTimes(), 1)
}

// A Retry-After above Config.MaxRetryAfter is cut to it: a partner asking
// for a day is tried again after the cap (here 300 ms).
func TestRetryAfterIsCapped(t *testing.T) {
	ep := newAnswering(t, answer(503, "Retry-After", "86400"), answer(204))
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) {
		c.Partners["p"] = ep.srv.URL
		c.MaxRetryAfter = 300 * time.Millisecond
	})
	h.post("p", 0)
	require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond)
	calls := ep.callTimes()
	require.Len(t, calls, 2)
	require.GreaterOrEqual(t, calls[1].Sub(calls[0]), 300*time.Millisecond)
}

// Any other 4xx is final for the event: one call despite a budget of 1000
// attempts, the event dead with the status and the answer's first bytes, the
// partner parked; Skip lets the next event go.
func TestClientErrorIsPermanentAndParks(t *testing.T) {
	ep := newAnswering(t, func(w http.ResponseWriter) {
		w.WriteHeader(422)
		_, _ = io.WriteString(w, `{"error":"unknown event type"}`)
	}, answer(204))
	h := newHarness(t, map[string]sim.Behavior{}, func(c *Config) { c.Partners["p"] = ep.srv.URL })
	_, first := h.post("p", 0)
	h.post("p", 1)
	require.Eventually(t, func() bool { return len(h.parked()) == 1 }, waitLong, 5*time.Millisecond)
	dead, err := h.store.Outbox().Dead(t.Context(), 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, first, dead[0].ID)
	require.Equal(t, 1, dead[0].Attempts)
	require.Contains(t, dead[0].Err, "422")
	require.Contains(t, dead[0].Err, `unknown event type`)
	require.Len(t, ep.callTimes(), 1)
	require.NoError(t, h.svc.Skip(context.Background(), "p", first))
	require.Eventually(t, func() bool { return len(ep.callTimes()) == 2 }, waitLong, 5*time.Millisecond)
	require.Eventually(t, func() bool { return h.status("p").Backlog == 0 }, waitLong, 5*time.Millisecond)
	require.Contains(t, h.status("p").LastError, "endpoint answered 422")
}

// A final 4xx says the destination is up: however many, they do not open its
// circuit breaker (which would refuse the other partners sharing it); the
// same number of 500s does.
func TestFinalClientErrorsDoNotOpenTheBreaker(t *testing.T) {
	code := atomic.Int32{}
	code.Store(400)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(code.Load()))
	}))
	defer srv.Close()
	d := testDeliverer(t, nil, map[string]string{"p": srv.URL}, nil) // opens after 3 failures
	ev := Delivery{Partner: "p", ID: "evt-1", Received: time.Now(), Body: []byte(`{}`)}
	for range 5 {
		r, ok := responseOf(d.Deliver(t.Context(), ev))
		require.True(t, ok)
		require.Equal(t, Permanent, r.Outcome)
	}
	st, _ := d.BreakerState(d.Destination("p"))
	require.Equal(t, "closed", st.String())
	code.Store(500)
	for range 3 {
		_ = d.Deliver(t.Context(), ev)
	}
	st, _ = d.BreakerState(d.Destination("p"))
	require.Equal(t, "open", st.String())
}
