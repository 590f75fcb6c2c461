package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/antspool"
	"github.com/keysched/keysched/internal/gopk"
	"github.com/keysched/keysched/internal/striped"
	"github.com/puzpuzpuz/xsync/v3"
)

// The rivals that come with keybench. Another package's rival registers
// itself the same way from a file of its own (see rivals in rival.go).
func init() {
	register(rivalInfo{
		Name: "chain", Order: 10, Ordered: true, New: newChain,
		Doc: "keysched: per-key chains on one bounded ants pool of --workers; --queue pending, --key-depth per key",
	})
	register(rivalInfo{
		Name: "striped", Order: 20, Ordered: true, New: newStriped,
		Doc: "--workers lanes, key hashed to a lane, each a bounded FIFO (--queue/--workers) and one goroutine",
	})
	register(rivalInfo{
		Name: "pool", Order: 30, Ordered: false, New: newPool,
		Doc: "a plain ants pool of --workers, no per-key order: the cost floor, and the violations",
	})
	register(rivalInfo{
		Name: "goroutine-per-key", Order: 40, Ordered: true, New: newPerKey,
		Doc: "a goroutine and an unbounded FIFO per live key: ordered, isolated, no bound at all",
	})
	register(rivalInfo{
		Name: "keyed-mutex", Order: 60, Ordered: false, New: newKeyedMutex,
		Doc: "a plain ants pool of --workers whose tasks lock a mutex per key: exclusion without order",
	})
}

// chainRival adapts keysched.
type chainRival struct{ s *keysched.Scheduler[string] }

func newChain(c rivalConfig) (rival, error) {
	opts := []keysched.Option{
		keysched.WithWorkers(c.Workers),
		keysched.WithLogger(slog.New(slog.DiscardHandler)),
	}
	if c.Queue > 0 {
		opts = append(opts, keysched.WithMaxPending(c.Queue))
	}
	if c.KeyDepth > 0 {
		opts = append(opts, keysched.WithMaxKeyDepth(c.KeyDepth))
	}
	s, err := keysched.New[string](opts...)
	if err != nil {
		return nil, err
	}
	return &chainRival{s}, nil
}

func (r *chainRival) Submit(ctx context.Context, key string, fn func()) error {
	return r.SubmitTask(ctx, key, func(context.Context) error { fn(); return nil })
}

func (r *chainRival) SubmitTask(ctx context.Context, key string, task func(context.Context) error) error {
	_, err := r.s.Submit(ctx, key, task)
	return err
}

func (r *chainRival) Close() error {
	ctx := context.Background()
	if err := r.s.Drain(ctx); err != nil {
		return err
	}
	if err := r.s.Close(ctx); err != nil {
		return err
	}
	st := r.s.Stats()
	if st.Succeeded != st.Submitted || st.Pending != 0 {
		return fmt.Errorf("keysched: %d submitted, %d succeeded, %d failed, %d panicked, %d aborted, %d pending",
			st.Submitted, st.Succeeded, st.Failed, st.Panicked, st.Aborted, st.Pending)
	}
	return nil
}

// stripedRival adapts internal/striped: as many lanes as workers, the queue
// bound split evenly over them.
type stripedRival struct{ l *striped.Lanes[string] }

func newStriped(c rivalConfig) (rival, error) {
	queue := c.Queue
	if queue <= 0 {
		queue = keysched.DefaultMaxPending
	}
	return &stripedRival{striped.NewHashed(c.Workers, max(1, queue/c.Workers), laneHash(c.Seed))}, nil
}

// laneHash is striped's hash of a key under the run's seed: xxhash of the
// key, mixed with the seed (splitmix64's finaliser), so that every seed
// partitions the keys into lanes differently and one seed always the same way.
func laneHash(seed uint64) func(string) uint64 {
	return func(k string) uint64 {
		z := xxhash.Sum64String(k) + seed*0x9e3779b97f4a7c15
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		return z ^ z>>31
	}
}

// laneOf returns the striped lane of key under seed with n lanes.
func laneOf(seed uint64, n int, key string) int { return striped.Lane(laneHash(seed)(key), n) }

func (r *stripedRival) Submit(ctx context.Context, key string, fn func()) error {
	return r.l.Submit(ctx, key, fn)
}

func (r *stripedRival) Close() error { r.l.Close(); return nil }

// poolRival adapts internal/antspool: every event straight to an ants pool.
type poolRival struct{ p *antspool.Pool[string] }

func newPool(c rivalConfig) (rival, error) {
	p, err := antspool.New[string](c.Workers)
	if err != nil {
		return nil, err
	}
	return &poolRival{p}, nil
}

func (r *poolRival) Submit(ctx context.Context, key string, fn func()) error {
	if err := ctx.Err(); err != nil {
		return err // ants' blocking Submit takes no context: check it before
	}
	return r.p.Submit(ctx, key, fn)
}

func (r *poolRival) Close() error { r.p.Close(); return nil }

// perKeyRival adapts internal/gopk.
type perKeyRival struct{ p *gopk.PerKey[string] }

func newPerKey(rivalConfig) (rival, error) { return &perKeyRival{gopk.New[string]()}, nil }

func (r *perKeyRival) Submit(ctx context.Context, key string, fn func()) error {
	return r.p.Submit(ctx, key, fn)
}

func (r *perKeyRival) Close() error { r.p.Close(); return nil }

// keyedMutexRival is the reflex "lock per key" design: a plain pool whose
// tasks take their key's mutex. Two events of one key never overlap, but
// nothing orders them (whichever worker locks first wins), and workers
// waiting for a hot key's lock are workers the other keys do not get.
// Mutexes are never removed, as in most hand-rolled versions.
type keyedMutexRival struct {
	p     *antspool.Pool[string]
	locks *xsync.MapOf[string, *sync.Mutex]
}

func newKeyedMutex(c rivalConfig) (rival, error) {
	p, err := antspool.New[string](c.Workers)
	if err != nil {
		return nil, err
	}
	return &keyedMutexRival{p: p, locks: xsync.NewMapOf[string, *sync.Mutex]()}, nil
}

func (r *keyedMutexRival) Submit(ctx context.Context, key string, fn func()) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.p.Submit(ctx, key, func() {
		mu, _ := r.locks.LoadOrCompute(key, func() *sync.Mutex { return new(sync.Mutex) })
		mu.Lock()
		defer mu.Unlock()
		fn()
	})
}

func (r *keyedMutexRival) Close() error { r.p.Close(); return nil }
