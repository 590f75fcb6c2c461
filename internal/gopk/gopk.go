// Package gopk is the goroutine-per-key rival used by keysched's benchmarks:
// each live key gets its own goroutine and an unbounded FIFO; the goroutine
// exits when its key's queue is empty. Order per key holds and keys are
// isolated, but goroutines and memory grow with live keys and queued work,
// without any bound: the reflex keysched's design rejects.
package gopk

import (
	"context"
	"sync"
)

type lane struct {
	q []func()
}

// PerKey runs each key's tasks on a goroutine of that key's own.
type PerKey[K comparable] struct {
	mu    sync.Mutex
	lanes map[K]*lane
	wg    sync.WaitGroup
}

// New returns an empty PerKey.
func New[K comparable]() *PerKey[K] { return &PerKey[K]{lanes: make(map[K]*lane)} }

// Submit queues fn behind key's earlier tasks; it never waits.
func (p *PerKey[K]) Submit(_ context.Context, key K, fn func()) error {
	p.mu.Lock()
	l, ok := p.lanes[key]
	if ok {
		l.q = append(l.q, fn)
		p.mu.Unlock()
		return nil
	}
	l = &lane{}
	p.lanes[key] = l
	p.wg.Add(1)
	p.mu.Unlock()
	go p.run(key, l, fn)
	return nil
}

func (p *PerKey[K]) run(key K, l *lane, fn func()) {
	defer p.wg.Done()
	for {
		fn()
		p.mu.Lock()
		if len(l.q) == 0 {
			delete(p.lanes, key)
			p.mu.Unlock()
			return
		}
		fn = l.q[0]
		l.q[0] = nil
		l.q = l.q[1:]
		p.mu.Unlock()
	}
}

// Close waits for every queued task to run.
func (p *PerKey[K]) Close() { p.wg.Wait() }
