package kafka

import (
	"testing"
	"unsafe"
)

// An item is written on the poll loop's core and read and finished on a
// worker's: it must fit one cache line of its slab, so that each record
// moves one line between the cores, not two (see item).
func TestItemIsOneCacheLine(t *testing.T) {
	if s := unsafe.Sizeof(item{}); s != 64 {
		t.Fatalf("item is %d bytes, want 64 (one cache line; itemChunk items a 2 KiB slab)", s)
	}
	if s := unsafe.Sizeof([itemChunk]item{}); s&(s-1) != 0 {
		t.Fatalf("a slab of %d items is %d bytes, want a power of two (its size class aligns it, and so every item, to 64 bytes)", itemChunk, s)
	}
}
