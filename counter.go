package keysched

import (
	"runtime"
	"sync/atomic"
	"unsafe"
)

// counter is a striped int64 counter for the counts every task touches
// (submitted, running, outcomes, slots freed): goroutines on different
// cores add to different cache lines, and Value sums them.
//
// The stripe is picked from the address of a variable on the calling
// goroutine's stack: goroutines have stacks of their own, so runners on
// different workers land on different stripes (mostly), at the cost of a
// shift and a multiply. (xsync.Counter, used before, takes and returns a
// sync.Pool token on every Add to pick its stripe: measured at about 15% of
// a no-op task's CPU, with five Adds a task.)
type counter struct {
	stripes []paddedInt64
	mask    uintptr
}

type paddedInt64 struct {
	v atomic.Int64
	_ padAfter8 // a cache line each
}

func newCounter() *counter {
	n := 1
	for n < runtime.GOMAXPROCS(0) {
		n <<= 1
	}
	n = min(max(n, 2), 64)
	return &counter{stripes: make([]paddedInt64, n), mask: uintptr(n - 1)}
}

// stripe returns the index of the calling goroutine's stripe.
func (c *counter) stripe() uintptr {
	var x byte
	p := uintptr(unsafe.Pointer(&x)) >> 10 // stacks are at least 2 KiB apart
	return (p * 0x9e3779b97f4a7c15 >> 32) & c.mask
}

func (c *counter) Add(d int64) { c.stripes[c.stripe()].v.Add(d) }
func (c *counter) Inc()        { c.Add(1) }
func (c *counter) Dec()        { c.Add(-1) }

// Value returns the sum of the stripes: exact when no Add runs meanwhile.
func (c *counter) Value() int64 {
	var s int64
	for i := range c.stripes {
		s += c.stripes[i].v.Load()
	}
	return s
}
