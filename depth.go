package keysched

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// This file holds the bounds: the per-key depth (queued plus running tasks of
// a key, kept in its chain header) and the scheduler's pending count, with the
// waiting that Submit does when either is at its bound.
//
// Every wait here follows one pattern, so that no wake-up is lost:
//
//	waiter:  register (waiters++) -> re-check the bound -> sleep on the channel
//	room:    free a slot          -> if waiters > 0, close the channel
//
// Both sides use sequentially consistent atomics, so either the waiter's
// re-check sees the freed slot, or the freer sees the registered waiter.

// gate is a broadcast wake-up: waiters sleep on a channel, wake closes it.
type gate struct {
	waiters atomic.Int32
	mu      sync.Mutex
	ch      chan struct{}
}

// register counts the caller as a waiter and returns the channel to sleep on.
// The caller must re-check its condition after register and call unregister
// when it stops waiting.
func (g *gate) register() <-chan struct{} {
	g.mu.Lock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	ch := g.ch
	g.waiters.Add(1)
	g.mu.Unlock()
	return ch
}

func (g *gate) unregister() { g.waiters.Add(-1) }

// wake releases every registered waiter; cheap when there are none.
func (g *gate) wake() {
	if g.waiters.Load() == 0 {
		return
	}
	g.mu.Lock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
	g.mu.Unlock()
}

// pendingBound counts accepted, unfinished tasks as two monotonic counters:
// slots taken (by submitters) and slots freed (by workers, on a striped
// counter so that workers on different cores do not contend). The closed
// flag lives in the taken word: "is the scheduler closed?" and "take a slot"
// are one CompareAndSwap, so no task is accepted once Close has started.
type pendingBound struct {
	_     padLine      // taken is written by every submission: away from what workers read
	taken atomic.Int64 // slots ever taken | closedBit
	_     padAfter8
	freed *counter // slots ever freed
	// seen is a recent value of freed, kept by submitters so that most
	// submissions need not sum the workers' stripes. It only lags, so a bound
	// check against it is conservative; a submitter that finds no room
	// through it sums freed itself.
	seen atomic.Int64
	max  int64
	_    padAfter24
	// The gates are read by every release (are there waiters?) and written
	// only when someone waits: a line of their own, away from the counters
	// and the ready queue, keeps those reads cheap.
	room gate // Submit waiting for a slot
	idle gate // Drain and Close waiting for zero
}

const closedBit = int64(1) << 62

func (b *pendingBound) tryAcquire() error {
	for {
		w := b.taken.Load()
		if w&closedBit != 0 {
			return ErrClosed
		}
		if w-b.seen.Load() >= b.max {
			f := b.freed.Value()
			b.seen.Store(f)
			if w-f >= b.max {
				return ErrFull
			}
		}
		if b.taken.CompareAndSwap(w, w+1) {
			return nil
		}
	}
}

// tryAcquireN takes up to want slots (at least one), as many as are free.
func (b *pendingBound) tryAcquireN(want int64) (int64, error) {
	for {
		w := b.taken.Load()
		if w&closedBit != 0 {
			return 0, ErrClosed
		}
		room := b.max - (w - b.seen.Load())
		if room < want {
			f := b.freed.Value()
			b.seen.Store(f)
			if room = b.max - (w - f); room <= 0 {
				return 0, ErrFull
			}
		}
		got := min(want, room)
		if b.taken.CompareAndSwap(w, w+got) {
			return got, nil
		}
	}
}

// acquireN is acquire for up to want slots: it takes as many as are free (at
// least one), waiting for the first when wait is set.
func (b *pendingBound) acquireN(ctx context.Context, want int64, wait bool, closing <-chan struct{}) (int64, error) {
	got, err := b.tryAcquireN(want)
	if !errors.Is(err, ErrFull) || !wait {
		return got, err
	}
	for {
		ch := b.room.register()
		got, err = b.tryAcquireN(want)
		if !errors.Is(err, ErrFull) {
			b.room.unregister()
			return got, err
		}
		select {
		case <-ch:
		case <-closing:
		case <-ctx.Done():
			b.room.unregister()
			return 0, fmt.Errorf("%w (waited for room until the context ended): %w", ErrFull, ctx.Err())
		}
		b.room.unregister()
	}
}

// releaseN gives back n slots taken and not used.
func (b *pendingBound) releaseN(n int64) {
	b.freed.Add(n)
	b.room.wake()
	if b.idle.waiters.Load() > 0 && b.count() == 0 {
		b.idle.wake()
	}
}

// acquire takes a slot, waiting for one when wait is set, until ctx ends or
// the scheduler closes (closing is closed when Close starts).
func (b *pendingBound) acquire(ctx context.Context, wait bool, closing <-chan struct{}) error {
	err := b.tryAcquire()
	if !errors.Is(err, ErrFull) || !wait {
		return err
	}
	for {
		ch := b.room.register()
		err = b.tryAcquire()
		if !errors.Is(err, ErrFull) {
			b.room.unregister()
			return err
		}
		select {
		case <-ch:
		case <-closing:
		case <-ctx.Done():
			b.room.unregister()
			return fmt.Errorf("%w (waited for room until the context ended): %w", ErrFull, ctx.Err())
		}
		b.room.unregister()
	}
}

// hold takes a slot whatever the bound and the closed flag: for work that is
// already accepted (a dead letter being delivered).
func (b *pendingBound) hold() { b.taken.Add(1) }

func (b *pendingBound) release() {
	b.freed.Inc()
	b.room.wake()
	if b.idle.waiters.Load() > 0 && b.count() == 0 {
		b.idle.wake()
	}
}

// count returns the pending tasks. Reading taken on both sides of freed
// makes it the true count at one instant when no slot was taken meanwhile;
// under a stream of submissions it settles for reading freed first, which can
// only overcount (a slot freed after the read stays pending; never one taken
// after it counts as finished), so an idle check on it is never fooled.
func (b *pendingBound) count() int64 {
	for range 4 {
		t := b.taken.Load()
		f := b.freed.Value()
		if b.taken.Load() == t {
			return t&^closedBit - f
		}
	}
	f := b.freed.Value()
	return b.taken.Load()&^closedBit - f
}

// closed reports whether the closed flag is set.
func (b *pendingBound) closed() bool { return b.taken.Load()&closedBit != 0 }

// close sets the closed flag.
func (b *pendingBound) close() { b.taken.Or(closedBit) }

// waitIdle waits until no task is pending, or ctx ends, or giveUp (which may
// be nil) is closed.
func (b *pendingBound) waitIdle(ctx context.Context, giveUp <-chan struct{}) error {
	for {
		ch := b.idle.register()
		if b.count() == 0 {
			b.idle.unregister()
			return nil
		}
		select {
		case <-ch:
			b.idle.unregister()
		case <-ctx.Done():
			b.idle.unregister()
			return ctx.Err()
		case <-giveUp:
			b.idle.unregister()
			return errGaveUp
		}
	}
}

// errGaveUp is the cause when a later Close's context ended first.
var errGaveUp = errors.New("a later Close's context ended")

// waitKey waits until ch, a full chain, has room (or has drained), ctx ends,
// or Close starts. The caller then retries the append from the start.
func (s *Scheduler[K]) waitKey(ctx context.Context, ch *chainHdr) error {
	s.keyMu.Lock()
	if ch.wake == nil {
		ch.wake = make(chan struct{})
	}
	wake := ch.wake
	ch.waiters.Add(1)
	s.keyMu.Unlock()
	defer ch.waiters.Add(-1)
	if ch.depth.Load() < s.maxKeyDepth {
		return nil
	}
	select {
	case <-wake:
		return nil
	case <-s.closing:
		return nil // the retry sees the closed flag
	case <-ctx.Done():
		return fmt.Errorf("%w (waited for room until the context ended): %w", ErrKeyFull, ctx.Err())
	}
}

// wakeKey releases the submitters waiting for room on ch.
func (s *Scheduler[K]) wakeKey(ch *chainHdr) {
	s.keyMu.Lock()
	if ch.wake != nil {
		close(ch.wake)
		ch.wake = nil
	}
	s.keyMu.Unlock()
}

// KeyDepth returns the key's queued plus running tasks: the quantity
// WithMaxKeyDepth bounds. It is 0 for a key with none (and for an invalid
// key). A cancelled task still counts until its key's chain reaches it.
func (s *Scheduler[K]) KeyDepth(key K) int {
	if s.zero() || s.keyCheck && !validKey(key) {
		return 0
	}
	ch, ok := s.tails.load(key)
	if !ok {
		return 0
	}
	return int(ch.depth.Load())
}
