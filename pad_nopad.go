//go:build keysched_nopad

package keysched

// The padding of pad.go, empty: go test -tags keysched_nopad -bench
// Submitters shows what false sharing costs. Never for production.
type (
	padLine    [0]byte
	padAfter8  [0]byte
	padAfter24 [0]byte
)
