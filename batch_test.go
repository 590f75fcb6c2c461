package keysched

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Per key, a batch's tasks run in item order, after the key's earlier tasks
// and before its later ones, also with runs of one key inside a batch, from
// several submitters at once.
func TestBatchOrderWithinAndAcrossBatches(t *testing.T) {
	s := newSched[int](t, WithWorkers(4))
	o := newOrderChecker()
	const submitters, keysPer, batches = 3, 5, 40
	var wg sync.WaitGroup
	for g := range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seq := map[int]int{}
			for b := range batches {
				var items []BatchItem[int]
				for i := range 1 + b%9 {
					key := g*keysPer + (i/3+b)%keysPer // runs of up to 3 of one key
					items = append(items, BatchItem[int]{Key: key, Task: o.task(key, seq[key], nil)})
					seq[key]++
				}
				if b%4 == 0 { // interleave single submissions
					key := g * keysPer
					items = append(items, BatchItem[int]{Key: key, Task: o.task(key, seq[key], nil)})
					seq[key]++
					cs, err := s.SubmitBatch(watchdog(t), items[:len(items)-1])
					require.NoError(t, err)
					require.Len(t, cs, len(items)-1)
					_, err = s.Submit(watchdog(t), key, items[len(items)-1].Task)
					require.NoError(t, err)
					continue
				}
				cs, err := s.SubmitBatch(watchdog(t), items)
				require.NoError(t, err)
				require.Len(t, cs, len(items))
			}
		}()
	}
	wg.Wait()
	// 20 s: a bound far above any normal run, so tasks that never complete
	// (a chain's next task dispatched beside it) fail here by name.
	require.NoError(t, s.Drain(hangGuard(t, 20*time.Second)))
	require.Zero(t, o.bad.Load(), "order")
	require.Zero(t, o.overlaps.Load(), "overlap")
	st := s.Stats()
	assertAccounting(t, st)
	require.Equal(t, st.Submitted, st.Succeeded)
	require.Zero(t, st.Keys, "drained keys are removed")
}

// Each Completion is its own item's: the returned slice is in item order.
func TestBatchCompletionsMatchItems(t *testing.T) {
	s := newSched[string](t)
	errs := []error{nil, errFlaky, nil}
	var items []BatchItem[string]
	for i, e := range errs {
		items = append(items, BatchItem[string]{Key: []string{"a", "a", "b"}[i], Task: func(context.Context) error { return e }})
	}
	// A bound, not a timing assertion: a completion that never comes (the
	// failed item's key parked, say) fails here by name.
	guard := hangGuard(t, 10*time.Second)
	cs, err := s.SubmitBatch(guard, items)
	require.NoError(t, err)
	require.Len(t, cs, 3)
	for i, c := range cs {
		require.Equal(t, errs[i], c.Wait(guard), "item %d", i)
	}
}

// A batch stops at the first task that does not fit: the accepted ones are a
// prefix, the error says why the next was refused, and only the prefix runs.
func TestTrySubmitBatchPartial(t *testing.T) {
	var ran sync.Map
	task := func(i int) Task { return func(context.Context) error { ran.Store(i, true); return nil } }
	// Each subtest has its own gate, opened when it ends: a subtest that
	// fails early leaves no task blocked on a gate the next one feeds (it
	// would take one of that subtest's openings, and that subtest would
	// wait for ever).
	newGate := func(t *testing.T) (chan struct{}, Task) {
		gate := make(chan struct{})
		t.Cleanup(func() { close(gate) })
		return gate, func(context.Context) error { <-gate; return nil }
	}

	t.Run("key depth", func(t *testing.T) {
		s := newSched[int](t, WithMaxKeyDepth(2))
		gate, blocked := newGate(t)
		_, err := s.Submit(watchdog(t), 1, blocked)
		require.NoError(t, err)
		items := []BatchItem[int]{{2, task(0)}, {1, task(1)}, {1, task(2)}, {3, task(3)}}
		cs, err := s.TrySubmitBatch(watchdog(t), items)
		require.ErrorIs(t, err, ErrKeyFull)
		require.ErrorContains(t, err, "2 of 4 tasks accepted, item 2 refused")
		require.Len(t, cs, 2)
		require.Equal(t, 2, s.KeyDepth(1))
		st := s.Stats()
		require.EqualValues(t, 3, st.Submitted)
		require.EqualValues(t, 2, st.Rejected, "the refused tasks")
		// Resubmitting the rest, once there is room, goes on in order.
		gate <- struct{}{}
		require.NoError(t, cs[1].Wait(watchdog(t)))
		cs2, err := s.SubmitBatch(watchdog(t), items[len(cs):])
		require.NoError(t, err)
		require.Len(t, cs2, 2)
		require.NoError(t, s.Drain(watchdog(t)))
		for i := range 4 {
			_, ok := ran.LoadAndDelete(i)
			require.True(t, ok, "task %d", i)
		}
	})

	t.Run("pending bound", func(t *testing.T) {
		s := newSched[int](t, WithMaxPending(3))
		gate, blocked := newGate(t)
		_, err := s.Submit(watchdog(t), 9, blocked)
		require.NoError(t, err)
		// The accepted tasks keep their room until the gate opens: the
		// batch admits again after dispatching what it linked, so tasks
		// that finished by then would free room for the rest (CI saw all
		// four accepted once, 2026-12-01).
		held := func(i int) Task { return func(context.Context) error { <-gate; ran.Store(i, true); return nil } }
		items := []BatchItem[int]{{1, held(10)}, {1, held(11)}, {2, task(12)}, {3, task(13)}}
		cs, err := s.TrySubmitBatch(watchdog(t), items)
		require.ErrorIs(t, err, ErrFull)
		require.ErrorContains(t, err, "2 of 4 tasks accepted, item 2 refused")
		require.Len(t, cs, 2)
		for range 3 { // task 9, then 10 and 11
			gate <- struct{}{}
		}
		for _, c := range cs {
			require.NoError(t, c.Wait(watchdog(t)))
		}
		require.NoError(t, s.Drain(watchdog(t)))
		_, ok := ran.Load(12)
		require.False(t, ok, "a refused task never runs")
		st := s.Stats()
		require.EqualValues(t, 3, st.Submitted)
		assertAccounting(t, st)
	})

	t.Run("closed", func(t *testing.T) {
		s, err := New[int](WithLogger(quiet))
		require.NoError(t, err)
		require.NoError(t, s.Close(watchdog(t)))
		for _, submit := range []func(context.Context, []BatchItem[int]) ([]*Completion, error){s.SubmitBatch, s.TrySubmitBatch} {
			cs, err := submit(watchdog(t), []BatchItem[int]{{1, task(20)}})
			require.ErrorIs(t, err, ErrClosed)
			require.Empty(t, cs)
		}
	})
}

// SubmitBatch waits for room, on a full key and on a full scheduler, and a
// batch larger than the pending bound goes through in parts; even when the
// room can only come from the batch's own tasks.
func TestSubmitBatchWaits(t *testing.T) {
	s := newSched[int](t, WithMaxPending(4), WithMaxKeyDepth(2), WithWorkers(2))
	o := newOrderChecker()
	var items []BatchItem[int]
	for i := range 50 {
		key := i % 3
		if i > 20 {
			key = 7 // a long run of one key: deeper than its bound
		}
		items = append(items, BatchItem[int]{Key: key, Task: o.task(key, countKey(items, key), nil)})
	}
	cs, err := s.SubmitBatch(watchdog(t), items)
	require.NoError(t, err)
	require.Len(t, cs, 50)
	require.NoError(t, s.Drain(watchdog(t)))
	require.Zero(t, o.bad.Load())
	require.EqualValues(t, 50, s.Stats().Succeeded)

	// A context that ends while the batch waits: the prefix is accepted.
	gate := make(chan struct{})
	_, err = s.Submit(watchdog(t), 1, func(context.Context) error { <-gate; return nil })
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(watchdog(t))
	go func() {
		for s.Stats().Rejected == 0 && s.KeyDepth(1) < 2 {
			runtime.Gosched()
		}
		cancel()
	}()
	cs, err = s.SubmitBatch(ctx, []BatchItem[int]{{1, noop}, {1, noop}, {2, noop}})
	require.ErrorIs(t, err, ErrKeyFull)
	require.ErrorIs(t, err, context.Canceled)
	require.Len(t, cs, 1)
	close(gate)
}

func countKey(items []BatchItem[int], key int) int {
	n := 0
	for _, it := range items {
		if it.Key == key {
			n++
		}
	}
	return n
}

// Bad input refuses the whole batch with a clear error, accepting nothing.
func TestBatchBadInput(t *testing.T) {
	s := newSched[any](t)
	ok := func(context.Context) error { return nil }
	for _, c := range []struct {
		ctx   context.Context
		items []BatchItem[any]
		want  error
		text  string
	}{
		{nil, []BatchItem[any]{{1, ok}}, ErrNilContext, ""},
		{context.Background(), nil, ErrEmptyBatch, ""},
		{context.Background(), []BatchItem[any]{}, ErrEmptyBatch, ""},
		{context.Background(), []BatchItem[any]{{1, ok}, {2, nil}}, ErrNilTask, "batch item 1"},
		{context.Background(), []BatchItem[any]{{1, ok}, {[]int{1}, ok}}, ErrInvalidKey, "batch item 1"},
		{cancelled(), []BatchItem[any]{{1, ok}}, context.Canceled, ""},
	} {
		for _, submit := range []func(context.Context, []BatchItem[any]) ([]*Completion, error){s.SubmitBatch, s.TrySubmitBatch} {
			cs, err := submit(c.ctx, c.items)
			require.ErrorIs(t, err, c.want)
			require.ErrorContains(t, err, c.text)
			require.Empty(t, cs)
		}
	}
	st := s.Stats()
	require.Zero(t, st.Submitted)
	require.Zero(t, st.Keys)
}

func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

var noop Task = func(context.Context) error { return nil }

// From inside a task, SubmitBatch never waits: it fails fast like TrySubmitBatch.
func TestSubmitBatchInsideTaskDoesNotWait(t *testing.T) {
	s := newSched[int](t, WithMaxKeyDepth(1))
	res := make(chan error, 1)
	_, err := s.Submit(watchdog(t), 1, func(ctx context.Context) error {
		cs, err := s.SubmitBatch(ctx, []BatchItem[int]{{2, noop}, {1, noop}})
		if len(cs) != 1 {
			err = nil
		}
		res <- err
		return nil
	})
	require.NoError(t, err)
	require.ErrorIs(t, <-res, ErrKeyFull)
}
