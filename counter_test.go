package keysched

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The striped counter sums exactly what was added, from any goroutines, and
// goroutines spread over its stripes.
func TestCounter(t *testing.T) {
	c := newCounter()
	var wg sync.WaitGroup
	used := make([]bool, len(c.stripes))
	var mu sync.Mutex
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			used[c.stripe()] = true
			mu.Unlock()
			for i := range 1000 {
				c.Add(int64(g))
				if i%2 == 0 {
					c.Inc()
				} else {
					c.Dec()
				}
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 1000*(15*16/2), c.Value())
	n := 0
	for _, u := range used {
		if u {
			n++
		}
	}
	require.Greater(t, n, 1, "16 goroutines on one stripe")
}
