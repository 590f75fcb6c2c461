package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/keysched/keysched/examples/webhook/sim"
)

// simulate starts n partners' endpoints on loopback and fills partners.
// Partner 1 is slow, 2 fails 30% of its calls, 3 hangs now and then, 4 is
// down now and then (long enough to be parked), the others answer within
// 5-20 ms; the last two share one endpoint (one destination).
func simulate(n int, rec *sim.Recorder, partners map[string]string) ([]*sim.Endpoint, error) {
	if n < 1 {
		return nil, fmt.Errorf("-partners %d: need at least 1", n)
	}
	var eps []*sim.Endpoint
	for i := range n {
		name := fmt.Sprintf("partner-%02d", i+1)
		if i == n-1 && n >= 6 {
			partners[name] = eps[len(eps)-1].URL // shares the previous partner's endpoint
			continue
		}
		b := sim.Behavior{Delay: time.Duration(5+rand.IntN(15)) * time.Millisecond}
		switch i {
		case 0:
			b = sim.Behavior{Delay: 400 * time.Millisecond} // slow, yet above its share of -sim-rate 20 (1.7 events/s of 2.5)
		case 1:
			b.FailRate = 0.3
		}
		e, err := sim.NewEndpoint(rec, b)
		if err != nil {
			for _, e := range eps {
				_ = e.Close()
			}
			return nil, err
		}
		eps = append(eps, e)
		partners[name] = e.URL
	}
	return eps, nil
}

// chaos makes endpoint 3 hang for 20 s of every minute, endpoint 4 go down
// for 40 s of every 90 s, and endpoint 5 answer 429 with "Retry-After: 3"
// for 10 s of every 45 s (its partner waits, spending no attempt).
func chaos(ctx context.Context, eps []*sim.Endpoint, log *slog.Logger) {
	if len(eps) < 4 {
		return
	}
	hang, down := eps[2], eps[3]
	var throttle *sim.Endpoint
	if len(eps) >= 5 {
		throttle = eps[4]
	}
	normal := sim.Behavior{Delay: 10 * time.Millisecond}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			s := int(now.Sub(start).Seconds())
			wantHang, wantDown := s%60 >= 40, s%90 >= 20 && s%90 < 60
			if hang.Behavior().Hang != wantHang {
				log.Info("simulation: endpoint 3 "+map[bool]string{true: "hangs", false: "is back"}[wantHang], "url", hang.URL)
				hang.Set(sim.Behavior{Delay: normal.Delay, Hang: wantHang})
			}
			if throttle != nil {
				wantThrottle := s%45 >= 30 && s%45 < 40
				if (throttle.Behavior().Throttle > 0) != wantThrottle {
					log.Info("simulation: endpoint 5 "+map[bool]string{true: "answers 429 Retry-After: 3", false: "is back"}[wantThrottle], "url", throttle.URL)
					b := sim.Behavior{Delay: normal.Delay}
					if wantThrottle {
						b.Throttle = 3
					}
					throttle.Set(b)
				}
			}
			if down.Behavior().Down != wantDown {
				log.Info("simulation: endpoint 4 "+map[bool]string{true: "is down", false: "is back"}[wantDown], "url", down.URL)
				down.Set(sim.Behavior{Delay: normal.Delay, Down: wantDown})
			}
		}
	}
}

// produce posts events to random partners at about rate per second.
func produce(ctx context.Context, intake string, partners []string, rate float64, log *slog.Logger) {
	client := &http.Client{Timeout: 5 * time.Second}
	// At least a microsecond: a rate so high that the interval rounds to
	// 0 made NewTicker panic.
	tick := time.NewTicker(max(time.Microsecond, time.Duration(float64(time.Second)/rate)))
	defer tick.Stop()
	var n, rejected int
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n++
		p := partners[rand.IntN(len(partners))]
		body := fmt.Sprintf(`{"type":"order.updated","data":{"order":%d,"seq":%d}}`, rand.IntN(1000), n)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, intake+"/events/"+p, bytes.NewBufferString(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("simulation: posting an event", "err", err)
			}
			continue
		}
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			rejected++
			if rejected%100 == 1 {
				log.Info("simulation: intake pushed back (429)", "partner", p, "rejected so far", rejected)
			}
		}
	}
}

// watchSignatures logs, every second, requests the simulated endpoints
// refused because their signature did not verify (there should be none).
func watchSignatures(ctx context.Context, rec *sim.Recorder, log *slog.Logger) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	seen := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if n, last := rec.BadSignatures(); n > seen {
			log.Error("simulation: endpoints refused requests whose webhook-signature did not verify", "count", n-seen, "total", n, "last reason", last)
			seen = n
		}
	}
}
