//go:build !keysched_nopad

package keysched

// Cache-line padding, for the fields that submitters and workers write on
// every task (see depth.go's pendingBound, pool.go's readyQueue, counter.go's
// stripes). Built with -tags keysched_nopad every pad is empty: that build
// exists only to show what the padding is worth (BenchmarkSubmitters).
type (
	padLine    [64]byte
	padAfter8  [56]byte // the rest of a line after an 8-byte field
	padAfter24 [48]byte
)
