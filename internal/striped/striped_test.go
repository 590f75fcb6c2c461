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

// NewHashed puts keys on the lanes its hash says: two keys on one lane wait
// behind each other (head-of-line blocking), a key on another lane does not.
func TestNewHashedPlacesKeysByTheHash(t *testing.T) {
	l := NewHashed[int](2, 8, func(k int) uint64 { return uint64(k) })
	defer l.Close()
	require.Equal(t, 0, Lane(4, 2))
	require.Equal(t, 1, Lane(7, 2))
	gate := make(chan struct{})
	ctx := context.Background()
	require.NoError(t, l.Submit(ctx, 2, func() { <-gate })) // lane 0 blocked
	behind := make(chan struct{})
	require.NoError(t, l.Submit(ctx, 4, func() { close(behind) })) // lane 0 too
	other := make(chan struct{})
	require.NoError(t, l.Submit(ctx, 3, func() { close(other) })) // lane 1
	<-other
	select {
	case <-behind:
		t.Fatal("key 4 ran while key 2, on its lane, was blocked")
	default:
	}
	close(gate)
	<-behind
}
