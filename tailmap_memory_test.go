package keysched

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// heapInuse is the heap in use after a full collection, in bytes.
func heapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// spike makes keys live at once (one task each, all waiting behind a gate:
// two workers hold two of them, the rest are queued heads), then opens the
// gate and drains. It returns the heap in use before, at the peak, and after
// the drain, with the scheduler still open.
func spike(t *testing.T, keys int, growOnly bool) (before, peak, after uint64) {
	defer func(old bool) { tailMapGrowOnly = old }(tailMapGrowOnly)
	tailMapGrowOnly = growOnly
	ctx := context.Background()
	before = heapInuse()
	s, err := New[int](WithWorkers(2), WithMaxPending(keys+1))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	gate := make(chan struct{})
	task := func(context.Context) error { <-gate; return nil }
	for k := range keys {
		if _, err := s.Submit(ctx, k, task); err != nil {
			t.Fatal(err)
		}
	}
	peak = heapInuse()
	close(gate)
	if err := s.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	after = heapInuse()
	runtime.KeepAlive(s)
	return before, peak, after
}

// The figure README.md gives: what the tail map keeps after a spike of live
// keys, grow-only and shrinking. KEYSCHED_SPIKE_KEYS sets the spike (default
// 1,000,000); run it alone: go test -run TestMeasureMemoryAfterSpike -v .
func TestMeasureMemoryAfterSpike(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KEYSCHED_SPIKE_KEYS"))
	if n == 0 {
		t.Skip("a measurement: KEYSCHED_SPIKE_KEYS=1000000 go test -run TestMeasureMemoryAfterSpike -v .")
	}
	for _, growOnly := range []bool{true, false} {
		b, p, a := spike(t, n, growOnly)
		mib := func(v uint64) float64 { return float64(v) / (1 << 20) }
		t.Logf("grow-only %v, %d keys: heap in use %.1f MiB before, %.1f MiB at the peak, %.1f MiB after the drain (%.1f MiB kept)",
			growOnly, n, mib(b), mib(p), mib(a), mib(a)-mib(b))
	}
}

// KEYSCHED_TAILMAP_SHRINK=1 makes every scheduler of the test binary use a
// shrinking tail map: the benchmarks of docs/performance.md ("Memory after a
// spike") run with and without it.
func init() {
	if os.Getenv("KEYSCHED_TAILMAP_SHRINK") == "1" {
		tailMapGrowOnly = false
	}
}
