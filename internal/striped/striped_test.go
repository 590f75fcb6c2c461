package striped

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Lanes keep each key's order (a key always maps to the same lane) and
// Close runs everything queued.
func TestOrderPerKeyAndClose(t *testing.T) {
	l := New[int](4, 8)
	var mu sync.Mutex
	seen := map[int][]int{}
	for i := range 1000 {
		k := i % 17
		require.NoError(t, l.Submit(context.Background(), k, func() {
			mu.Lock()
			seen[k] = append(seen[k], i)
			mu.Unlock()
		}))
	}
	l.Close()
	total := 0
	for _, got := range seen {
		require.IsIncreasing(t, got)
		total += len(got)
	}
	require.Equal(t, 1000, total)
	require.ErrorIs(t, l.Submit(context.Background(), 1, func() {}), ErrClosed)
}

// A full lane makes Submit wait until its context ends.
func TestFullLaneWaits(t *testing.T) {
	l := New[int](1, 0)
	gate := make(chan struct{})
	require.NoError(t, l.Submit(context.Background(), 1, func() { <-gate }))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, l.Submit(ctx, 2, func() {}), context.Canceled)
	close(gate)
	l.Close()
}
