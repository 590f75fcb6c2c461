package antspool

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRunsEverything(t *testing.T) {
	p, err := New[int](4)
	require.NoError(t, err)
	var n atomic.Int64
	for i := range 1000 {
		require.NoError(t, p.Submit(context.Background(), i, func() { n.Add(1) }))
	}
	p.Close()
	require.EqualValues(t, 1000, n.Load())
}
