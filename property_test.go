package keysched

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// The state machine below drives a real scheduler with random mixes of
// Submit, TrySubmit, Cancel, tasks that succeed, fail, fail a few times,
// panic or fail permanently, retries, parking with Resume and Skip, and a
// final Drain or aborting Close, against a sequential model.
//
// Every task waits on a gate that only the model opens (or on its context),
// so the model knows exactly which tasks are unfinished: it predicts every
// KeyDepth, Pending, refusal (ErrKeyFull, ErrFull), outcome and counter. The
// tasks themselves check per-key order and that two tasks of a key never
// overlap.

var errFlaky = errors.New("flaky")

var errSnoozed = errors.New("refused locally")

type behaviour int

const (
	bOK          behaviour = iota
	bFailN                 // fails its first n attempts
	bPanic                 // always panics
	bPermanent             // fails with a Permanent error
	bSnoozeFailN           // snoozes its first s runs, then fails n attempts, then succeeds
	numBehaviours
)

type ptask struct {
	id, key   int
	b         behaviour
	n         int // bFailN, bSnoozeFailN: failures before success
	snoozes   int // bSnoozeFailN: snoozed runs first
	gate      chan struct{}
	attempts  atomic.Int32
	c         *Completion
	cancelled bool
	finished  bool
}

type psm struct {
	tb                 *testing.T
	s                  *Scheduler[int]
	keys               int
	maxDepth, maxPend  int
	maxAttempts        int
	park               bool
	abortAtEnd         bool
	next               int
	chains             map[int][]*ptask // unfinished (or cancelled, not yet passed) tasks per key, in order
	parked             map[int]bool
	want               Stats
	dlMu               sync.Mutex
	deadLetters        int
	letters            map[*Completion]int // per task: dead letters delivered (fn returned)
	mu                 sync.Mutex
	lastRun            map[int]int // per key, the id of the last task to start an attempt
	running            map[int]*atomic.Bool
	orderErr, overlaps atomic.Int64
}

func newPSM(t *rapid.T, tb *testing.T) *psm {
	m := &psm{
		tb:          tb,
		keys:        rapid.IntRange(1, 4).Draw(t, "keys"),
		maxDepth:    rapid.IntRange(1, 4).Draw(t, "maxDepth"),
		maxPend:     rapid.IntRange(1, 8).Draw(t, "maxPending"),
		maxAttempts: rapid.IntRange(1, 3).Draw(t, "maxAttempts"),
		park:        rapid.Bool().Draw(t, "park"),
		abortAtEnd:  rapid.Bool().Draw(t, "abortAtEnd"),
		chains:      map[int][]*ptask{},
		parked:      map[int]bool{},
		lastRun:     map[int]int{},
		running:     map[int]*atomic.Bool{},
		letters:     map[*Completion]int{},
	}
	opts := []Option{
		// More workers than keys: a task the model has not released holds a
		// worker, and a cancelled task at the front of its key is passed
		// only when a worker reaches it; with a spare worker that is always
		// soon, so the model can wait for it. (Fewer workers than busy keys
		// are covered by the example-based tests.)
		WithWorkers(m.keys + rapid.IntRange(1, 2).Draw(t, "spareWorkers")),
		WithMaxKeyDepth(m.maxDepth), WithMaxPending(m.maxPend), WithLogger(quiet),
		WithDeadLetter(func(dl DeadLetter[int]) {
			c := dl.Context.(dlContext).c
			m.dlMu.Lock()
			m.deadLetters++
			m.letters[c]++
			m.dlMu.Unlock()
		}),
	}
	if m.maxAttempts > 1 {
		opts = append(opts, WithRetry(RetryPolicy{MaxAttempts: m.maxAttempts, InitialBackoff: time.Microsecond, MaxBackoff: 10 * time.Microsecond}))
	}
	if m.park {
		opts = append(opts, WithFailurePolicy(Park))
	}
	s, err := New[int](opts...)
	require.NoError(t, err)
	m.s = s
	for k := range m.keys {
		m.running[k] = new(atomic.Bool)
	}
	return m
}

func (m *psm) pending() int {
	n := 0
	for _, ch := range m.chains {
		n += len(ch)
	}
	return n
}

func (m *psm) task(p *ptask) Task {
	flag := m.running[p.key]
	return func(ctx context.Context) error {
		select {
		case <-p.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		if !flag.CompareAndSwap(false, true) {
			m.overlaps.Add(1)
		}
		defer flag.Store(false)
		m.mu.Lock()
		if last, ok := m.lastRun[p.key]; ok && last > p.id {
			m.orderErr.Add(1)
		}
		m.lastRun[p.key] = p.id
		m.mu.Unlock()
		a := int(p.attempts.Add(1))
		switch p.b {
		case bFailN:
			if a <= p.n {
				return errFlaky
			}
		case bPanic:
			panic("boom")
		case bPermanent:
			return Permanent(errFlaky)
		case bSnoozeFailN:
			switch {
			case a <= p.snoozes:
				return Snooze(errSnoozed, time.Microsecond)
			case a-p.snoozes <= p.n:
				return errFlaky
			}
		}
		return nil
	}
}

// Submit adds a task, or checks that the scheduler refuses it for the reason
// the model expects.
func (m *psm) Submit(t *rapid.T) {
	key := rapid.IntRange(0, m.keys-1).Draw(t, "key")
	p := &ptask{id: m.next, key: key, gate: make(chan struct{})}
	p.b = behaviour(rapid.IntRange(0, int(numBehaviours)-1).Draw(t, "behaviour"))
	p.n = rapid.IntRange(1, 4).Draw(t, "failures")
	if p.b == bSnoozeFailN {
		p.snoozes = rapid.IntRange(1, 4).Draw(t, "snoozes")
		p.n--
	}
	ctx := context.Background()
	var wantErr error
	switch {
	case m.pending() >= m.maxPend:
		wantErr = ErrFull
	case len(m.chains[key]) >= m.maxDepth:
		wantErr = ErrKeyFull
	}
	if wantErr != nil {
		if rapid.Bool().Draw(t, "blocking") {
			// Submit waits for room: with nothing finishing, until ctx ends.
			// (If the deadline passes before Submit even looks, it returns
			// the bare context error: nothing was enqueued either way.)
			wctx, cancel := context.WithTimeout(ctx, time.Millisecond)
			_, err := m.s.Submit(wctx, key, m.task(p))
			cancel()
			require.ErrorIs(t, err, context.DeadlineExceeded)
			if err != context.DeadlineExceeded { //nolint:errorlint // the bare ctx error (nothing waited) vs one wrapped with wantErr
				require.ErrorIs(t, err, wantErr)
			}
		} else {
			_, err := m.s.TrySubmit(ctx, key, m.task(p))
			require.ErrorIs(t, err, wantErr)
		}
		m.want.Rejected++
		return
	}
	submit := m.s.Submit
	if rapid.Bool().Draw(t, "try") {
		submit = m.s.TrySubmit
	}
	c, err := submit(ctx, key, m.task(p))
	require.NoError(t, err)
	p.c = c
	m.next++
	m.chains[key] = append(m.chains[key], p)
	m.want.Submitted++
}

// SubmitBatch submits a batch of 1 to 6 tasks (keys often repeated, so runs
// of one key occur), with SubmitBatch or TrySubmitBatch. The model accepts
// items in order while they fit (pending first, then the key's depth) and
// expects the first that does not to be refused with its reason, the rest
// with it; a waiting SubmitBatch waits there until its context ends.
func (m *psm) SubmitBatch(t *rapid.T) {
	size := rapid.IntRange(1, 6).Draw(t, "batchSize")
	var items []BatchItem[int]
	var ps []*ptask
	key := rapid.IntRange(0, m.keys-1).Draw(t, "batchKey")
	for i := range size {
		if rapid.IntRange(0, 2).Draw(t, "sameKey") == 0 {
			key = rapid.IntRange(0, m.keys-1).Draw(t, "batchKey")
		}
		p := &ptask{id: m.next + i, key: key, gate: make(chan struct{})}
		p.b = behaviour(rapid.IntRange(0, int(numBehaviours)-1).Draw(t, "behaviour"))
		p.n = rapid.IntRange(1, 4).Draw(t, "failures")
		items = append(items, BatchItem[int]{Key: key, Task: m.task(p)})
		ps = append(ps, p)
	}
	// The model's prediction.
	accept, pend := 0, m.pending()
	depth := map[int]int{}
	var wantErr error
	for _, p := range ps {
		if pend >= m.maxPend {
			wantErr = ErrFull
			break
		}
		if len(m.chains[p.key])+depth[p.key] >= m.maxDepth {
			wantErr = ErrKeyFull
			break
		}
		accept++
		pend++
		depth[p.key]++
	}
	var cs []*Completion
	var err error
	if rapid.Bool().Draw(t, "tryBatch") || wantErr == nil {
		cs, err = m.s.TrySubmitBatch(context.Background(), items)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		cs, err = m.s.SubmitBatch(ctx, items)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		if err == context.DeadlineExceeded { //nolint:errorlint // bare: the deadline passed before SubmitBatch looked
			// The deadline passed before SubmitBatch looked: nothing accepted.
			accept, wantErr = 0, context.DeadlineExceeded
		}
	}
	if wantErr == nil {
		require.NoError(t, err)
	} else {
		require.ErrorIs(t, err, wantErr)
	}
	require.Len(t, cs, accept)
	for i, p := range ps[:accept] {
		p.c = cs[i]
		m.chains[p.key] = append(m.chains[p.key], p)
	}
	m.next += accept // refused tasks' ids are reused: they never run
	m.want.Submitted += uint64(accept)
	m.want.Rejected += uint64(size - accept)
}

// head returns the key's oldest task that has not been cancelled.
func (m *psm) head(key int) *ptask {
	for _, p := range m.chains[key] {
		if !p.cancelled {
			return p
		}
	}
	return nil
}

// pass drops the finished and cancelled tasks at the front of key's chain:
// the scheduler moves past them.
func (m *psm) pass(key int) {
	ch := m.chains[key]
	for len(ch) > 0 && (ch[0].finished || ch[0].cancelled) {
		ch = ch[1:]
	}
	if len(ch) == 0 {
		delete(m.chains, key)
	} else {
		m.chains[key] = ch
	}
}

// Complete opens the gate of a key's head task and waits for it to finish or
// to park, predicting which.
func (m *psm) Complete(t *rapid.T) {
	key := rapid.IntRange(0, m.keys-1).Draw(t, "key")
	p := m.head(key)
	if p == nil || m.parked[key] {
		t.Skip("no runnable head")
	}
	made := int(p.attempts.Load())
	if p.front() {
		close(p.gate)
	}
	m.settle(t, p, made)
}

func (p *ptask) front() bool {
	select {
	case <-p.gate:
		return false
	default:
		return true
	}
}

// settle waits until p is done or parked and updates the model; made is
// the attempts p had made before this run.
func (m *psm) settle(t *rapid.T, p *ptask, made int) {
	budget := m.maxAttempts
	var want error
	out := outSucceeded
	attempts := 1 // runs that this run makes
	snoozes := 0  // of which snoozed (not attempts)
	switch p.b {
	case bFailN:
		attempts = min(p.n-made+1, budget)
		if p.n-made >= budget {
			want, out = errFlaky, outFailed
		}
	case bPanic:
		want, out = &PanicError{}, outPanicked
	case bPermanent:
		want, out = errFlaky, outFailed
	case bSnoozeFailN:
		snoozes = max(0, p.snoozes-made)
		left := p.n - max(0, made-p.snoozes) // failures still to come
		if left >= budget {
			attempts = snoozes + budget
			want, out = errFlaky, outFailed
		} else {
			attempts = snoozes + left + 1
		}
	}
	m.want.Snoozed += uint64(snoozes)
	ctx := watchdog(m.tb)
	if out != outSucceeded && m.park {
		// Dead-lettered, then parked: the task stays unfinished.
		for !slices.Contains(m.s.Parked(), p.key) {
			require.NoError(t, ctx.Err(), "key %d never parked", p.key)
			runtime.Gosched()
		}
		m.parked[p.key] = true
		m.want.ParkedKeys++
		m.want.DeadLettered++
		require.Equal(t, made+attempts, int(p.attempts.Load()), "attempts")
		m.want.Retried += uint64(attempts - snoozes - 1)
		return
	}
	err := p.c.Wait(ctx)
	switch {
	case want == nil:
		require.NoError(t, err)
	case out == outPanicked:
		var pe *PanicError
		require.ErrorAs(t, err, &pe)
	default:
		require.ErrorIs(t, err, want)
	}
	if out != outSucceeded {
		m.want.DeadLettered++
		m.requireLetter(t, p)
	}
	require.Equal(t, made+attempts, int(p.attempts.Load()), "attempts")
	m.want.Retried += uint64(attempts - snoozes - 1)
	m.count(out)
	p.finished = true
	m.pass(p.key)
}

// requireLetter checks, once p's Completion is done with a failure or an
// abort, that its dead letter was delivered already (issue 8: a Completion
// is done only once its dead letter was delivered, on every path).
func (m *psm) requireLetter(t *rapid.T, p *ptask) {
	m.dlMu.Lock()
	n := m.letters[p.c]
	m.dlMu.Unlock()
	require.Positive(t, n, "task %d done before its dead letter was delivered", p.id)
}

func (m *psm) count(out int) {
	switch out {
	case outSucceeded:
		m.want.Succeeded++
	case outFailed:
		m.want.Failed++
	case outPanicked:
		m.want.Panicked++
	case outCancelled:
		m.want.Cancelled++
	case outAborted:
		m.want.Aborted++
	}
}

// Cancel withdraws an unfinished task that is not running its gate open.
func (m *psm) Cancel(t *rapid.T) {
	var live []*ptask
	for _, ch := range m.chains {
		for _, p := range ch {
			if !p.cancelled && !p.finished && !m.parked[p.key] {
				live = append(live, p)
			}
		}
	}
	if len(live) == 0 {
		t.Skip("nothing to cancel")
	}
	slices.SortFunc(live, func(a, b *ptask) int { return a.id - b.id })
	p := rapid.SampledFrom(live).Draw(t, "task")
	p.c.Cancel()
	// Queued: done at once. Running (waiting on its gate): its context is
	// cancelled and it returns the context's error. Either way: cancelled.
	require.ErrorIs(t, p.c.Wait(watchdog(m.tb)), context.Canceled)
	p.cancelled = true
	m.want.Cancelled++
	m.pass(p.key)
}

// Resume runs a parked key's head again; Skip gives it up.
func (m *psm) ResumeOrSkip(t *rapid.T) {
	key := rapid.IntRange(0, m.keys-1).Draw(t, "key")
	if !m.parked[key] {
		require.ErrorIs(t, m.s.Resume(key), ErrNotParked)
		require.ErrorIs(t, m.s.Skip(key), ErrNotParked)
		return
	}
	p := m.head(key)
	delete(m.parked, key)
	m.want.ParkedKeys--
	if rapid.Bool().Draw(t, "skip") {
		require.NoError(t, m.s.Skip(key))
		var out int
		switch p.b {
		case bPanic:
			out = outPanicked
			var pe *PanicError
			require.ErrorAs(t, p.c.Wait(watchdog(m.tb)), &pe)
		default:
			out = outFailed
			require.ErrorIs(t, p.c.Wait(watchdog(m.tb)), errFlaky)
		}
		m.requireLetter(t, p)
		m.count(out)
		p.finished = true
		m.pass(key)
		return
	}
	made := int(p.attempts.Load())
	require.NoError(t, m.s.Resume(key))
	m.settle(t, p, made)
}

// Check compares the scheduler with the model after every action.
func (m *psm) Check(t *rapid.T) {
	require.Zero(t, m.orderErr.Load(), "a key's tasks ran out of order")
	require.Zero(t, m.overlaps.Load(), "two tasks of a key overlapped")
	ctx := watchdog(m.tb)
	// Slots are given back just after a task's Completion is done: wait for
	// the scheduler to catch up with the model.
	for m.s.Stats().Pending != m.pending() {
		require.NoError(t, ctx.Err(), "pending %d, model %d", m.s.Stats().Pending, m.pending())
		runtime.Gosched()
	}
	for k := range m.keys {
		require.Equal(t, len(m.chains[k]), m.s.KeyDepth(k), "depth of key %d", k)
	}
	got := m.s.Stats()
	require.Equal(t, len(m.chains), got.Keys)
	require.Equal(t, m.want.ParkedKeys, got.ParkedKeys)
	parked := m.s.Parked()
	slices.Sort(parked)
	var wantParked []int
	for k := range m.parked {
		wantParked = append(wantParked, k)
	}
	slices.Sort(wantParked)
	require.Equal(t, fmt.Sprint(wantParked), fmt.Sprint(parked))
	w := m.want
	require.Equal(t, w.Submitted, got.Submitted)
	require.Equal(t, w.Rejected, got.Rejected)
	require.Equal(t, w.Succeeded, got.Succeeded)
	require.Equal(t, w.Failed, got.Failed)
	require.Equal(t, w.Panicked, got.Panicked)
	require.Equal(t, w.Retried, got.Retried)
	require.Equal(t, w.Snoozed, got.Snoozed)
	require.GreaterOrEqual(t, got.Cancelled, w.Cancelled)
	require.Equal(t, w.Cancelled, got.Cancelled)
}

// finish ends a run: either every gate opens and Close drains, or Close's
// context has ended and every unfinished task is aborted.
func (m *psm) finish(t *rapid.T) {
	ctx := watchdog(m.tb)
	defer func() {
		// Whatever happened above (a failed check, a discarded case), the
		// scheduler must not outlive the case.
		ended, cancel := context.WithCancel(ctx)
		cancel()
		_ = m.s.Close(ended)
	}()
	if t.Failed() {
		// A check failed: the model is out of step with the scheduler, so
		// the waits below could only run to the watchdog, once per case
		// rapid shrinks. The deferred Close ends the scheduler at once.
		return
	}
	if m.abortAtEnd {
		ended, cancel := context.WithCancel(ctx)
		cancel()
		err := m.s.Close(ended)
		if m.pending() > 0 {
			require.ErrorIs(t, err, ErrAborted)
		}
		for _, ch := range m.chains {
			for _, p := range ch {
				if p.cancelled {
					continue
				}
				// Parked, queued, or running (it returns its cancelled
				// context's error): aborted, all of them.
				perr := p.c.Wait(ctx)
				require.Error(t, perr)
				m.requireLetter(t, p)
				m.want.Aborted++
			}
		}
		// Runners still moving keys past the aborted tasks.
		require.NoError(t, m.s.pending.waitIdle(ctx, nil))
	} else {
		// Release everything; a released task may fail and park its key
		// again (Park policy): skip parked keys until nothing is pending.
		for _, ch := range m.chains {
			for _, p := range ch {
				if !p.cancelled && !p.finished && p.front() {
					close(p.gate)
				}
			}
		}
		for m.s.Stats().Pending > 0 {
			require.NoError(t, ctx.Err(), "tasks never finished")
			for _, k := range m.s.Parked() {
				err := m.s.Skip(k)
				require.True(t, err == nil || errors.Is(err, ErrNotParked), err)
			}
			runtime.Gosched()
		}
		require.NoError(t, m.s.Close(ctx))
		require.Empty(t, m.s.Parked())
	}
	st := m.s.Stats()
	assertAccounting(t, st)
	require.Equal(t, m.want.Submitted, st.Submitted)
	require.Zero(t, st.Keys)
}

func TestPropertyStateMachine(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := newPSM(rt, t)
		defer m.finish(rt)
		rt.Repeat(rapid.StateMachineActions(m))
	})
}
