package keysched

import (
	"hash/maphash"
	"reflect"

	"github.com/puzpuzpuz/xsync/v3"
)

// tailMap maps each live key to the tail of its chain. Appending a task and
// removing a drained key each happen inside one Compute on that key, so the
// map's per-key (per-bucket) lock is the only lock on the submit path.
//
// Rules for the Compute functions below (see DESIGN.md): no user code, no
// channel operation, no allocation beyond a chain header, nothing that can
// panic. xsync leaves a bucket locked forever when a compute function panics,
// and hashing an unhashable key panics inside the map: keys are checked by
// validKey before they get here.
type tailMap[K comparable] struct {
	m *xsync.MapOf[K, *node[K]]
}

func newTailMap[K comparable]() tailMap[K] {
	seed := maphash.MakeSeed()
	// xsync/v3's default hasher hashes an interface key holding a pointer,
	// channel or map by the first bytes of what it points to rather than by
	// the pointer itself, so such a key is lost once its target changes (a
	// channel after a send). maphash.Comparable is the runtime's own map hash:
	// right for every comparable type, and allocation-free.
	hasher := func(k K, tableSeed uint64) uint64 {
		return maphash.Comparable(seed, k) ^ tableSeed
	}
	return tailMap[K]{m: xsync.NewMapOfWithHasher[K, *node[K]](hasher, xsync.WithGrowOnly())}
}

// append links n at the end of its key's chain. It reports head when n starts
// a new chain (the key had none: n must be dispatched by the caller), or the
// chain when the key is at maxDepth (nothing was linked; wait on that chain).
// A new chain uses spare as its header when given (see headNode).
func (t tailMap[K]) append(n *node[K], maxDepth int64, k *core, spare *chainHdr) (head bool, full *chainHdr) {
	t.m.Compute(n.key, func(tail *node[K], loaded bool) (*node[K], bool) {
		if !loaded {
			ch := spare
			if ch == nil {
				ch = new(chainHdr)
			}
			ch.core = k
			ch.depth.Store(1)
			ch.head.Store(&n.Completion)
			n.hdr = ch
			head = true
			return n, false
		}
		ch := tail.hdr
		if ch.depth.Load() >= maxDepth {
			full = ch
			return tail, false // unchanged (xsync/v3 has no "leave as is")
		}
		ch.depth.Add(1)
		n.hdr = ch
		// The predecessor's completer reads next outside the map: it either
		// sees n here, or takes the key's bucket lock in removeIfTail after
		// this Compute and finds n as the tail's successor.
		tail.next.Store(n)
		return n, false
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
	t.m.Compute(first.key, func(tail *node[K], loaded bool) (*node[K], bool) {
		var ch *chainHdr
		var room int64
		if loaded {
			ch = tail.hdr
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
			return tail, !loaded // unchanged; a key that was absent stays so
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
			head = true
			return &run[m-1], false
		}
		// As in append: the predecessor's completer sees first here, or
		// finds it in removeIfTail after this Compute.
		tail.next.Store(first)
		return &run[m-1], false
	})
	return linked, head, full
}

// removeIfTail is called when n, finished, had no successor. If n is still
// its key's tail the key is drained and removed, in the same Compute that
// confirms it; otherwise a task was appended meanwhile (inside an earlier
// Compute on this key, so n.next is set) and that successor is returned.
func (t tailMap[K]) removeIfTail(n *node[K]) (next *node[K]) {
	t.m.Compute(n.key, func(tail *node[K], loaded bool) (*node[K], bool) {
		if !loaded || tail == n {
			return nil, true
		}
		next = n.next.Load()
		return tail, false
	})
	return next
}

// load returns the key's tail, if it has a chain.
func (t tailMap[K]) load(key K) (*node[K], bool) { return t.m.Load(key) }

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
