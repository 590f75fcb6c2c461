// Package striped is the striped-lane rival used by keysched's benchmarks:
// the key is hashed onto one of N lanes, each lane one bounded channel and one
// goroutine. Tasks of one key keep their order (they share a lane), but one
// slow key stalls every key that hashes onto its lane: head-of-line blocking.
package striped

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
)

// ErrClosed is returned by Submit after Close.
var ErrClosed = errors.New("striped: closed")

// Lanes is a fixed set of lanes, each a bounded FIFO served by one goroutine.
type Lanes[K comparable] struct {
	hash  func(K) uint64
	lanes []chan func()
	wg    sync.WaitGroup
	mu    sync.RWMutex // held for reading by Submit, for writing by Close
	done  bool
}

// New starts n lanes, each buffering up to depth tasks. Keys are spread over
// the lanes by the runtime's map hash with a seed drawn at random: which keys
// share a lane differs from process to process.
func New[K comparable](n, depth int) *Lanes[K] {
	seed := maphash.MakeSeed()
	return NewHashed(n, depth, func(k K) uint64 { return maphash.Comparable(seed, k) })
}

// NewHashed is New with the caller's hash: key k goes to lane
// Lane(hash(k), n). A hash with a fixed seed makes the partition of keys
// into lanes reproducible from run to run.
func NewHashed[K comparable](n, depth int, hash func(K) uint64) *Lanes[K] {
	if n < 1 {
		n = 1
	}
	if depth < 0 {
		depth = 0
	}
	l := &Lanes[K]{hash: hash, lanes: make([]chan func(), n)}
	for i := range l.lanes {
		ch := make(chan func(), depth)
		l.lanes[i] = ch
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for fn := range ch {
				fn()
			}
		}()
	}
	return l
}

// Submit puts fn on key's lane, waiting while the lane is full or until ctx ends.
func (l *Lanes[K]) Submit(ctx context.Context, key K, fn func()) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.done {
		return ErrClosed
	}
	ch := l.lanes[Lane(l.hash(key), len(l.lanes))]
	select {
	case ch <- fn:
		return nil
	default:
	}
	select {
	case ch <- fn:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Lane returns the lane, in [0, n), of a key whose hash is h.
func Lane(h uint64, n int) int { return int(h % uint64(n)) }

// Close stops accepting tasks and waits for the queued ones to run.
func (l *Lanes[K]) Close() {
	l.mu.Lock()
	if !l.done {
		l.done = true
		for _, ch := range l.lanes {
			close(ch)
		}
	}
	l.mu.Unlock()
	l.wg.Wait()
}
