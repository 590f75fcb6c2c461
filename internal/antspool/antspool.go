// Package antspool is the plain-pool rival used by keysched's benchmarks:
// every task is submitted straight to an ants pool, with no per-key order.
// It shows the cost floor of the pool itself, and the order violations that a
// pool without keys produces.
package antspool

import (
	"context"
	"sync"

	"github.com/panjf2000/ants/v2"
)

// Pool runs each task on an ants pool as soon as a worker is free.
type Pool[K comparable] struct {
	p  *ants.Pool
	wg sync.WaitGroup
}

// New starts an ants pool of n workers. Submit blocks while all are busy.
func New[K comparable](n int) (*Pool[K], error) {
	p, err := ants.NewPool(n)
	if err != nil {
		return nil, err
	}
	return &Pool[K]{p: p}, nil
}

// Submit runs fn on a free worker, waiting for one; the key is ignored.
func (p *Pool[K]) Submit(_ context.Context, _ K, fn func()) error {
	p.wg.Add(1)
	if err := p.p.Submit(func() { defer p.wg.Done(); fn() }); err != nil {
		p.wg.Done()
		return err
	}
	return nil
}

// Close waits for the submitted tasks and releases the pool.
func (p *Pool[K]) Close() {
	p.wg.Wait()
	p.p.Release()
}
