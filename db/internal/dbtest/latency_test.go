package dbtest

import (
	"context"
	"testing"
	"time"
)

// Through a LatencyProxy every round trip takes at least its delay, the
// answers are the server's, and SetDelay(0) takes the delay away on the
// open connections.
func TestLatencyProxyDelaysRoundTrips(t *testing.T) {
	s := NewServer(t)
	p := s.LatencyProxy(t, 300*time.Millisecond)
	db := p.Open(t)
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	roundTrip := func() time.Duration {
		t.Helper()
		start := time.Now()
		var n int
		if err := db.QueryRowContext(ctx, "SELECT 41 + 1").Scan(&n); err != nil || n != 42 {
			t.Fatalf("SELECT 41 + 1 through the proxy: %d, %v", n, err)
		}
		return time.Since(start)
	}
	roundTrip() // the connection is made
	for range 3 {
		if d := roundTrip(); d < 300*time.Millisecond {
			t.Fatalf("a round trip took %v through a 300 ms proxy", d)
		}
	}
	p.SetDelay(0)
	roundTrip() // bytes queued before the change are no longer in the way
	fast := time.Hour
	for range 5 {
		fast = min(fast, roundTrip())
	}
	if fast >= 300*time.Millisecond {
		t.Fatalf("after SetDelay(0) the fastest of 5 round trips took %v", fast)
	}
}
