package gopk

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOrderPerKeyAndNoResidue(t *testing.T) {
	p := New[int]()
	var mu sync.Mutex
	seen := map[int][]int{}
	for i := range 1000 {
		k := i % 13
		require.NoError(t, p.Submit(context.Background(), k, func() {
			mu.Lock()
			seen[k] = append(seen[k], i)
			mu.Unlock()
		}))
	}
	p.Close()
	total := 0
	for _, got := range seen {
		require.IsIncreasing(t, got)
		total += len(got)
	}
	require.Equal(t, 1000, total)
	p.mu.Lock()
	require.Empty(t, p.lanes, "a drained key's goroutine and lane are gone")
	p.mu.Unlock()
}
