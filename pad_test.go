//go:build !keysched_nopad

package keysched

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// The fields written on every task by one side (submitters, or workers) are
// at least a cache line (64 bytes) away from what the other side touches on
// every task, whatever the struct's alignment: a field added next to them
// must not put them back on one line. (BenchmarkSubmitters shows the cost:
// compare it with a -tags keysched_nopad build.)
func TestHotFieldsOnLinesOfTheirOwn(t *testing.T) {
	var s Scheduler[int]
	far := func(name string, a, b uintptr) {
		t.Helper()
		d := int64(a) - int64(b)
		require.GreaterOrEqual(t, max(d, -d), int64(64), name)
	}
	base := unsafe.Offsetof(s.pending)
	taken := base + unsafe.Offsetof(s.pending.taken)
	freed := base + unsafe.Offsetof(s.pending.freed)
	seen := base + unsafe.Offsetof(s.pending.seen)
	room := base + unsafe.Offsetof(s.pending.room) + unsafe.Offsetof(s.pending.room.waiters)
	idle := base + unsafe.Offsetof(s.pending.idle) + unsafe.Offsetof(s.pending.idle.waiters)
	far("taken (submitters' CAS) vs the field before the bound", taken, base-8)
	far("taken vs freed (read by workers)", taken, freed)
	far("taken vs seen", taken, seen)
	far("taken vs room's waiters (read by every release)", taken, room)
	far("taken vs idle's waiters", taken, idle)
	far("freed/seen vs room's waiters", seen, room)

	rq := unsafe.Offsetof(s.ready)
	mu := rq + unsafe.Offsetof(s.ready.mu)
	n := rq + unsafe.Offsetof(s.ready.n)
	far("ready queue's lock vs the field before the queue", mu, rq-8)
	far("ready queue's length vs the field after the queue", n, rq+unsafe.Sizeof(s.ready))
	far("ready queue vs pending bound's gates", mu, idle)

	require.EqualValues(t, 64, unsafe.Sizeof(paddedInt64{}), "a counter stripe is one line")
}
