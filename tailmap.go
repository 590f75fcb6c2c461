package keysched

import (
	"reflect"

	"github.com/puzpuzpuz/xsync/v4"
)

// tailMap maps each live key to its chain's header, which holds the chain's
// tail. Appending a task and removing a drained key each happen inside one
// Compute on that key, so the map's per-key (per-bucket) lock is the only
// lock on the submit path; the header's tail field is read and written only
// inside those Computes.
//
// The map's value is the header, not the tail, so that an append to a live
// key leaves the map's entry as it is (xsync's CancelOp): no entry is
// allocated per task, only per chain.
//
// Rules for the Compute functions below (see DESIGN.md): no user code, no
// channel operation, no allocation beyond a chain header, nothing that can
// panic. xsync leaves a bucket locked forever when a compute function panics,
// and hashing an unhashable key panics inside the map: keys are checked by
// validKey before they get here. (xsync/v4 hashes keys with
// maphash.Comparable, the runtime's own map hash: right for every comparable
// type, interface keys holding pointers included.)
type tailMap[K comparable] struct {
	m *xsync.Map[K, *chainHdr]
}

// tailMapGrowOnly makes the tail map grow-only (a test switch, to measure
// the two against each other).
var tailMapGrowOnly = true

func newTailMap[K comparable]() tailMap[K] {
	if tailMapGrowOnly {
		return tailMap[K]{m: xsync.NewMap[K, *chainHdr](xsync.WithGrowOnly())}
	}
	return tailMap[K]{m: xsync.NewMap[K, *chainHdr]()}
}

// append links n at the end of its key's chain. It reports head when n starts
// a new chain (the key had none: n must be dispatched by the caller), or the
// chain when the key is at maxDepth (nothing was linked; wait on that chain).
// A new chain uses spare as its header when given (see headNode).
func (t tailMap[K]) append(n *node[K], maxDepth int64, k *core, spare *chainHdr) (head bool, full *chainHdr) {
	t.m.Compute(n.key, func(ch *chainHdr, loaded bool) (*chainHdr, xsync.ComputeOp) {
		if !loaded {
			ch = spare
			if ch == nil {
				ch = new(chainHdr)
			}
			ch.core = k
			ch.depth.Store(1)
			ch.head.Store(&n.Completion)
			ch.tail = &n.Completion
			n.hdr = ch
			head = true
			return ch, xsync.UpdateOp
		}
		if ch.depth.Load() >= maxDepth {
			full = ch
			return ch, xsync.CancelOp
		}
		ch.depth.Add(1)
		n.hdr = ch
		// The predecessor's completer reads next outside the map: it either
		// sees n here, or takes the key's bucket lock in removeIfTail after
		// this Compute and finds n as the tail's successor.
		nodeOf[K](ch.tail).next.Store(n)
		ch.tail = &n.Completion
		return ch, xsync.CancelOp
	})
	return head, full
}

// appendRun links the nodes of run, consecutive tasks of one key, at the end
// of their key's chain in one Compute: as many as the key's depth bound
// allows. It returns how many it linked (a prefix of run), head when run[0]
// starts a new chain (the caller dispatches it), and the chain when the bound
// stopped it short (to wait on). A new chain's header is allocated inside the
// Compute: the only allocation allowed there.
func (t tailMap[K]) appendRun(run []node[K], maxDepth int64, k *core) (linked int, head bool, full *chainHdr) {
	first := &run[0]
	t.m.Compute(first.key, func(ch *chainHdr, loaded bool) (*chainHdr, xsync.ComputeOp) {
		var room int64
		if loaded {
			room = maxDepth - ch.depth.Load()
		} else {
			ch = new(chainHdr)
			ch.core = k
			room = maxDepth
		}
		m := int(min(room, int64(len(run))))
		if m < len(run) {
			full = ch
		}
		if m <= 0 {
			return ch, xsync.CancelOp // a key that was absent stays so
		}
		for i := range m {
			run[i].hdr = ch
			if i+1 < m {
				run[i].next.Store(&run[i+1])
			}
		}
		run[m-1].next.Store(nil)
		linked = m
		ch.depth.Add(int64(m))
		if !loaded {
			ch.head.Store(&first.Completion)
			ch.tail = &run[m-1].Completion
			head = true
			return ch, xsync.UpdateOp
		}
		// As in append: the predecessor's completer sees first here, or
		// finds it in removeIfTail after this Compute.
		nodeOf[K](ch.tail).next.Store(first)
		ch.tail = &run[m-1].Completion
		return ch, xsync.CancelOp
	})
	return linked, head, full
}

// removeIfTail is called when n, finished, had no successor. If n is still
// its key's tail the key is drained and removed, in the same Compute that
// confirms it; otherwise a task was appended meanwhile (inside an earlier
// Compute on this key, so n.next is set) and that successor is returned.
func (t tailMap[K]) removeIfTail(n *node[K]) (next *node[K]) {
	t.m.Compute(n.key, func(ch *chainHdr, loaded bool) (*chainHdr, xsync.ComputeOp) {
		if !loaded || ch.tail == &n.Completion {
			return nil, xsync.DeleteOp
		}
		next = n.next.Load()
		return ch, xsync.CancelOp
	})
	return next
}

// load returns the key's chain header, if it has a chain.
func (t tailMap[K]) load(key K) (*chainHdr, bool) { return t.m.Load(key) }

// keyNeedsCheck reports whether values of type t can fail as map keys at run
// time: an interface (its dynamic value may be a slice) or a float (NaN is not
// equal to itself), anywhere inside t.
func keyNeedsCheck(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Interface, reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return true
	case reflect.Array:
		return keyNeedsCheck(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if keyNeedsCheck(t.Field(i).Type) {
				return true
			}
		}
	}
	return false
}

// validKey reports whether k can be hashed and found again: comparing k with
// itself panics for an unhashable dynamic value and is false for NaN.
func validKey[K comparable](k K) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return k == k
}
