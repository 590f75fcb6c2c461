// Per-key order: tasks of one key run one at a time in acceptance order,
// keys run concurrently, a blocked key holds one worker, chains of any length
// leave no residue. (The model-based property test is property_test.go; a
// recorded stream replayed is replay_test.go.)

package keysched

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// orderChecker records, per key, that tasks run in submission order and never
// overlap: each task checks it is the next expected one, and flags itself
// running with a CompareAndSwap that fails if another task of its key runs.
type orderChecker struct {
	mu       sync.Mutex
	next     map[int]int
	running  map[int]*atomic.Bool
	bad      atomic.Int64
	overlaps atomic.Int64
}

func newOrderChecker() *orderChecker {
	return &orderChecker{next: map[int]int{}, running: map[int]*atomic.Bool{}}
}

func (o *orderChecker) task(key, seq int, work func()) Task {
	o.mu.Lock()
	if o.running[key] == nil {
		o.running[key] = new(atomic.Bool)
	}
	flag := o.running[key]
	o.mu.Unlock()
	return func(context.Context) error {
		if !flag.CompareAndSwap(false, true) {
			o.overlaps.Add(1)
		}
		o.mu.Lock()
		if o.next[key] != seq {
			o.bad.Add(1)
		}
		o.next[key] = seq + 1
		o.mu.Unlock()
		if work != nil {
			work()
		}
		flag.Store(false)
		return nil
	}
}

// Property 1: per key, task i's run happens before task i+1's begins.
func TestPerKeyOrderAndNoOverlap(t *testing.T) {
	s := newSched[int](t, WithWorkers(8), WithMaxKeyDepth(64), WithMaxPending(512))
	ctx := watchdog(t)
	o := newOrderChecker()
	const keys, per = 50, 400
	var wg sync.WaitGroup
	// Several submitters, each owning some keys, so each key's order is the
	// order its one submitter accepted them.
	for g := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				for k := g; k < keys; k += 5 {
					_, err := s.Submit(ctx, k, o.task(k, i, runtime.Gosched))
					require.NoError(t, err)
				}
			}
		}()
	}
	wg.Wait()
	require.NoError(t, s.Drain(ctx))
	require.Zero(t, o.bad.Load(), "tasks of a key ran out of order")
	require.Zero(t, o.overlaps.Load(), "tasks of a key overlapped")
	st := s.Stats()
	require.EqualValues(t, keys*per, st.Succeeded)
	assertAccounting(t, st)
}

// Property 2: a key whose task blocks holds exactly one worker; other keys
// keep flowing; its queued tasks hold no worker and no goroutine.
func TestBlockedKeyHoldsOneWorker(t *testing.T) {
	const workers = 4
	s := newSched[string](t, WithWorkers(workers))
	ctx := watchdog(t)
	release := make(chan struct{})
	started := make(chan struct{})
	_, err := s.Submit(ctx, "stuck", func(context.Context) error { close(started); <-release; return nil })
	require.NoError(t, err)
	<-started
	base := runtime.NumGoroutine()
	var queued []*Completion
	for range 1000 {
		c, err := s.Submit(ctx, "stuck", func(context.Context) error { return nil })
		require.NoError(t, err)
		queued = append(queued, c)
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), base+2, "queued tasks must not hold goroutines")
	require.Equal(t, 1001, s.KeyDepth("stuck"))

	// Other keys flow: all of them finish while "stuck" is still stuck.
	var others []*Completion
	for i := range 5000 {
		c, err := s.Submit(ctx, fmt.Sprint("k", i%100), func(context.Context) error { return nil })
		require.NoError(t, err)
		others = append(others, c)
	}
	for _, c := range others {
		require.NoError(t, c.Wait(ctx))
	}
	// A task's Completion is done before its key has passed it on, and
	// Pending counts it until then (see Stats): the last of the others
	// leave Pending a moment after their Waits return (CI saw 1003).
	require.Eventually(t, func() bool { return s.Stats().Pending <= 1001 }, 30*time.Second, time.Millisecond,
		"the other keys' tasks leave Pending once passed")
	st := s.Stats()
	require.Equal(t, 1, st.Running, "only the stuck task runs")
	require.Equal(t, 1001, st.Pending)
	require.LessOrEqual(t, runtime.NumGoroutine(), base+workers+2)
	for _, c := range queued {
		require.Nil(t, c.Err())
		select {
		case <-c.Done():
			t.Fatal("a task queued behind the stuck one finished")
		default:
		}
	}
	close(release)
	require.NoError(t, s.Drain(ctx))
	for _, c := range queued {
		require.NoError(t, c.Wait(ctx))
	}
}

// Property 3: goroutines do not grow with queued work.
func TestGoroutinesDoNotGrowWithQueuedWork(t *testing.T) {
	keys, per := 100_000, 10
	if testing.Short() || raceEnabled {
		// 200,000 queued tasks: a goroutine per queued task or per key would
		// still show as tens of thousands.
		keys, per = 20_000, 10
	}
	const workers = 8
	s := newSched[int](t, WithWorkers(workers), WithMaxPending(keys*per))
	ctx := watchdog(t)
	release := make(chan struct{})
	base := runtime.NumGoroutine()
	// Every key's head blocks: workers of them run, the rest wait their turn.
	block := func(context.Context) error { <-release; return nil }
	noop := func(context.Context) error { return nil }
	for k := range keys {
		_, err := s.Submit(ctx, k, block)
		require.NoError(t, err)
	}
	for range per - 1 {
		for k := range keys {
			_, err := s.Submit(ctx, k, noop)
			require.NoError(t, err)
		}
	}
	require.Equal(t, keys*per, s.Stats().Pending)
	// The pool's workers, plus ants' two housekeeping goroutines.
	require.LessOrEqual(t, runtime.NumGoroutine(), base+workers+4)
	close(release)
	require.NoError(t, s.Drain(ctx))
	require.EqualValues(t, keys*per, s.Stats().Succeeded)
}

// Property 4: a long chain runs in a loop, not by recursion.
func TestLongChainDoesNotRecurse(t *testing.T) {
	n := 500_000
	if testing.Short() {
		n = 50_000
	}
	old := debug.SetMaxStack(32 << 20)
	defer debug.SetMaxStack(old)
	s := newSched[int](t, WithWorkers(2), WithMaxKeyDepth(n+1), WithMaxPending(n+1))
	ctx := watchdog(t)
	release := make(chan struct{})
	_, err := s.Submit(ctx, 1, func(context.Context) error { <-release; return nil })
	require.NoError(t, err)
	var ran atomic.Int64
	for range n {
		_, err := s.Submit(ctx, 1, func(context.Context) error { ran.Add(1); return nil })
		require.NoError(t, err)
	}
	close(release)
	require.NoError(t, s.Drain(ctx))
	require.EqualValues(t, n, ran.Load())
}

// Property 5: no per-key residue.
func TestNoPerKeyResidue(t *testing.T) {
	n := 1_000_000
	if testing.Short() || raceEnabled {
		// 300,000 one-shot keys: a leak of ~100 bytes a key is still 30 MB,
		// far above the bound below.
		n = 300_000
	}
	s := newSched[int](t, WithWorkers(4))
	ctx := watchdog(t)
	noop := func(context.Context) error { return nil }
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	// Warm up: the tail map's table grows to the peak of live keys (bounded
	// by WithMaxPending) and stays, like a Go map; measure after that.
	for k := range 100_000 {
		_, err := s.Submit(ctx, -1-k, noop)
		require.NoError(t, err)
	}
	require.NoError(t, s.Drain(ctx))
	before := heap()
	for k := range n { // one-shot keys, increasing integers
		_, err := s.Submit(ctx, k, noop)
		require.NoError(t, err)
	}
	require.NoError(t, s.Drain(ctx))
	require.Zero(t, s.Stats().Keys)
	after := heap()
	growth := int64(after) - int64(before)
	t.Logf("heap before %d, after %d one-shot keys %d (growth %d bytes, %.2f per key)",
		before, n, after, growth, float64(growth)/float64(n))
	// A leak would keep ~100 bytes per key: 30-100 MB here. Allow what the
	// table may still grow to for a peak of DefaultMaxPending live keys.
	require.Less(t, growth, int64(8<<20))
}

// Property 7: a one-worker pool whose tasks each submit three more, to other
// keys and their own, never deadlocks.
func TestTasksSubmittingOnOneWorkerDoNotDeadlock(t *testing.T) {
	s := newSched[int](t, WithWorkers(1), WithMaxKeyDepth(4), WithMaxPending(64))
	ctx := watchdog(t)
	var ran, refused atomic.Int64
	var spawn func(level, key int) Task
	spawn = func(level, key int) Task {
		return func(tctx context.Context) error {
			ran.Add(1)
			if level == 0 {
				return nil
			}
			for i := range 3 {
				k := key // the first child goes to the task's own key
				if i > 0 {
					k = key*3 + i
				}
				if _, err := s.Submit(tctx, k, spawn(level-1, k)); err != nil {
					// With the task's context a full scheduler refuses at
					// once instead of waiting for this very worker.
					require.True(t, errors.Is(err, ErrKeyFull) || errors.Is(err, ErrFull), err)
					refused.Add(1)
				}
			}
			return nil
		}
	}
	for r := range 20 {
		_, err := s.Submit(ctx, r*1000, spawn(6, r*1000))
		require.NoError(t, err)
		require.NoError(t, s.Drain(ctx))
	}
	st := s.Stats()
	t.Logf("ran %d tasks, %d submissions refused at once", ran.Load(), refused.Load())
	require.EqualValues(t, ran.Load(), st.Succeeded)
	require.Positive(t, refused.Load(), "the bounds were never reached: the test is too small")
	assertAccounting(t, st)
}

// A key of interface type holding a pointer or a channel must keep finding
// its chain after what it points to changes (xsync/v3's default hasher
// hashes the target's bytes, so such a key would start a second chain).
func TestInterfaceKeysHoldingPointers(t *testing.T) {
	s := newSched[any](t, WithWorkers(4))
	ctx := watchdog(t)
	type account struct{ balance int }
	acct := &account{}
	ch := make(chan int, 4)
	for _, key := range []any{acct, ch} {
		release := make(chan struct{})
		o := newOrderChecker()
		_, err := s.Submit(ctx, key, func(context.Context) error { <-release; return nil })
		require.NoError(t, err)
		var cs []*Completion
		for i := range 10 {
			acct.balance += 100 // mutate the pointee between submissions
			ch <- i
			<-ch
			c, err := s.Submit(ctx, key, o.task(0, i, nil))
			require.NoError(t, err)
			cs = append(cs, c)
		}
		require.Equal(t, 11, s.KeyDepth(key), "every task joined the same chain")
		close(release)
		for _, c := range cs {
			require.NoError(t, c.Wait(ctx))
		}
		require.Zero(t, o.bad.Load())
		require.Zero(t, o.overlaps.Load())
	}
	require.NoError(t, s.Drain(ctx))
	require.Zero(t, s.Stats().Keys)
}

// A queued task costs its node and one map entry: two allocations, nothing
// else (no goroutine, no timer, no context wrapper), on a deep chain.
func TestSubmitAllocations(t *testing.T) {
	s := newSched[int](t, WithWorkers(1), WithMaxKeyDepth(1<<20), WithMaxPending(1<<20))
	ctx, cancel := context.WithCancel(watchdog(t)) // a cancellable context: no wrapper either
	defer cancel()
	gate := make(chan struct{})
	open := sync.OnceFunc(func() { close(gate) })
	defer open() // also when an assertion fails: Close waits for the gated tasks
	block := func(context.Context) error { <-gate; return nil }
	_, err := s.Submit(ctx, 1, block)
	require.NoError(t, err)
	noop := func(context.Context) error { return nil }
	// A task for a live key: its node, nothing else (the map's entry is left
	// as it is).
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := s.Submit(ctx, 1, noop); err != nil {
			t.Fatal(err)
		}
	})
	require.LessOrEqual(t, allocs, 1.0, "live key")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 1000 {
		if _, err := s.Submit(ctx, 1, noop); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	require.LessOrEqual(t, float64(after.TotalAlloc-before.TotalAlloc)/1000, 96.0, "bytes per task, live key")
	// A task that starts a key: its node with the chain header, and the
	// map's entry.
	k := 1000
	allocs = testing.AllocsPerRun(1000, func() {
		k++
		if _, err := s.Submit(ctx, k, block); err != nil {
			t.Fatal(err)
		}
	})
	require.LessOrEqual(t, allocs, 2.0, "new key")
	// A batch of 64 for live keys: its nodes in one allocation, and the
	// slice of Completions.
	items := make([]BatchItem[int], 64)
	for i := range items {
		items[i] = BatchItem[int]{Key: 1, Task: noop}
	}
	allocs = testing.AllocsPerRun(100, func() {
		if _, err := s.SubmitBatch(ctx, items); err != nil {
			t.Fatal(err)
		}
	})
	require.LessOrEqual(t, allocs, 2.0, "batch of 64")
	open()
	require.NoError(t, s.Drain(ctx))
}

// A busy key yields its worker: the runner that runs a key's tasks back to
// back puts the key at the back of the ready queue after a small budget
// (keyBudget), so on one worker a key with a long backlog cannot keep a
// later key's task waiting for the whole backlog.
func TestBusyKeyYieldsItsWorker(t *testing.T) {
	s := newSched[string](t, WithWorkers(1))
	ctx := watchdog(t)
	gate := make(chan struct{})
	var mu sync.Mutex
	var order []string
	record := func(name string) Task {
		return func(context.Context) error {
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			return nil
		}
	}
	_, err := s.Submit(ctx, "hot", func(context.Context) error { <-gate; return nil })
	require.NoError(t, err)
	const backlog = 4 * keyBudget
	for range backlog {
		_, err := s.Submit(ctx, "hot", record("hot"))
		require.NoError(t, err)
	}
	_, err = s.Submit(ctx, "cold", record("cold"))
	require.NoError(t, err)
	close(gate)
	require.NoError(t, s.Drain(ctx))
	mu.Lock()
	defer mu.Unlock()
	at := slices.Index(order, "cold")
	require.GreaterOrEqual(t, at, 0)
	require.LessOrEqual(t, at, keyBudget, "the cold key waited behind %d of the hot key's %d tasks", at, backlog)
}
