package keysched

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// event is one Observer call, as obsRecorder keeps it.
type event struct {
	kind string // accepted, started, ended, dead
	key  string
	at   Mono // Accepted's and DeadLettered's time
	a    AttemptInfo
	err  error
}

type obsRecorder struct {
	mu     sync.Mutex
	events []event
}

func (r *obsRecorder) add(e event) { r.mu.Lock(); r.events = append(r.events, e); r.mu.Unlock() }

func (r *obsRecorder) observer() Observer[string] {
	return Observer[string]{
		Accepted:       func(k string, at Mono) { r.add(event{kind: "accepted", key: k, at: at}) },
		AttemptStarted: func(k string, a AttemptInfo) { r.add(event{kind: "started", key: k, a: a}) },
		AttemptEnded:   func(k string, a AttemptInfo) { r.add(event{kind: "ended", key: k, a: a}) },
		DeadLettered:   func(k string, at Mono, err error) { r.add(event{kind: "dead", key: k, at: at, err: err}) },
	}
}

func (r *obsRecorder) of(key string) []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []event
	for _, e := range r.events {
		if e.key == key {
			out = append(out, e)
		}
	}
	return out
}

// split separates the Accepted events from the others.
func split(es []event) (accepted, rest []event) {
	for _, e := range es {
		if e.kind == "accepted" {
			accepted = append(accepted, e)
		} else {
			rest = append(rest, e)
		}
	}
	return accepted, rest
}

func kinds(es []event) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.kind)
	}
	return out
}

// The observer sees every event of every task, in order per task, with
// timestamps that give the exact queue wait and attempt duration (fake time).
func TestObserverEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var rec obsRecorder
		s := newBubbleSched[string](t, WithWorkers(4), WithObserver(rec.observer()),
			WithDeadLetter(func(DeadLetter[string]) {}),
			WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second, MaxBackoff: time.Second}))
		ctx := context.Background()
		t0 := MonoNow()

		// "slow": a 3 s task, then one queued behind it for those 3 s.
		_, err := s.Submit(ctx, "slow", func(context.Context) error { time.Sleep(3 * time.Second); return nil })
		require.NoError(t, err)
		_, err = s.Submit(ctx, "slow", func(context.Context) error { return nil })
		require.NoError(t, err)
		// "retry": fails once, succeeds on the second attempt.
		tries := 0
		_, err = s.Submit(ctx, "retry", func(context.Context) error {
			if tries++; tries == 1 {
				return errFail
			}
			return nil
		})
		require.NoError(t, err)
		// "dead": fails for good (Permanent), dead-lettered.
		_, err = s.Submit(ctx, "dead", func(context.Context) error { return Permanent(errFail) })
		require.NoError(t, err)
		// "panic": panics (not retried), dead-lettered.
		_, err = s.Submit(ctx, "panic", func(context.Context) error { panic("boom") })
		require.NoError(t, err)
		require.NoError(t, s.Drain(ctx))

		// The submitter's and the worker's events interleave: look at each
		// side's in order.
		slowAll := rec.of("slow")
		acc, slow := split(slowAll)
		require.Len(t, acc, 2)
		require.Equal(t, t0, acc[0].at, "no time passed while submitting")
		require.Equal(t, t0, acc[1].at)
		require.Equal(t, []string{"started", "ended", "started", "ended"}, kinds(slow))
		first, second := slow[1].a, slow[3].a
		require.Equal(t, 1, first.N)
		require.Equal(t, t0, first.Started)
		require.Equal(t, 3*time.Second, first.Ended.Sub(first.Started), "the attempt's duration")
		require.NoError(t, first.Err)
		require.Equal(t, 3*time.Second, second.Started.Sub(second.Accepted), "the second task's queue wait")
		require.Equal(t, time.Duration(0), second.Ended.Sub(second.Started))
		require.Equal(t, slow[2].a.Started, second.Started, "AttemptStarted and AttemptEnded agree")

		retry := rec.of("retry")
		require.Equal(t, []string{"accepted", "started", "ended", "started", "ended"}, kinds(retry))
		require.Equal(t, 1, retry[2].a.N)
		require.ErrorIs(t, retry[2].a.Err, errFail)
		require.Equal(t, 2, retry[4].a.N)
		require.NoError(t, retry[4].a.Err)
		require.Equal(t, retry[1].a.Accepted, retry[3].a.Accepted, "a retry keeps its task's acceptance time")
		require.LessOrEqual(t, retry[3].a.Started.Sub(retry[2].a.Ended), time.Second, "the backoff")

		dead := rec.of("dead")
		require.Equal(t, []string{"accepted", "started", "ended", "dead"}, kinds(dead))
		require.ErrorIs(t, dead[3].err, errFail)

		pan := rec.of("panic")
		require.Equal(t, []string{"accepted", "started", "ended", "dead"}, kinds(pan))
		require.True(t, pan[2].a.Panicked)
		var pe *PanicError
		require.ErrorAs(t, pan[2].a.Err, &pe)
	})
}

// A parked key's Resume restarts the attempt count (as DeadLetter.Attempts
// does); a task Close gives up on is reported dead-lettered with ErrAborted.
func TestObserverResumeAndAbort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var rec obsRecorder
		s, err := New[string](WithLogger(quiet), WithObserver(rec.observer()), WithFailurePolicy(Park),
			WithDeadLetter(func(DeadLetter[string]) {}))
		require.NoError(t, err)
		ctx := context.Background()
		fail := true
		_, err = s.Submit(ctx, "p", func(context.Context) error {
			if fail {
				return errFail
			}
			return nil
		})
		require.NoError(t, err)
		_, err = s.Submit(ctx, "p", func(context.Context) error { return nil })
		require.NoError(t, err)
		synctest.Wait()
		require.Equal(t, []string{"p"}, s.Parked())
		fail = false
		require.NoError(t, s.Resume("p"))
		synctest.Wait()
		acc, p := split(rec.of("p"))
		require.Len(t, acc, 2)
		require.Equal(t, []string{"started", "ended", "dead", "started", "ended", "started", "ended"}, kinds(p))
		require.Equal(t, 2, p[4].a.N, "a resumed task's attempts go on counting")

		// A parked key that Close gives up on.
		_, err = s.Submit(ctx, "q", func(context.Context) error { return errFail })
		require.NoError(t, err)
		synctest.Wait()
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		require.ErrorIs(t, s.Close(cctx), ErrAborted)
		q := rec.of("q")
		require.Equal(t, []string{"accepted", "started", "ended", "dead", "dead"}, kinds(q))
		require.ErrorIs(t, q[4].err, ErrAborted)
	})
}

// A panicking observer loses its events but nothing else: tasks run, their
// outcomes are right, and the panic is logged once.
func TestObserverPanicIsContained(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))
	boom := func() { panic("observer bug") }
	s, err := New[int](WithLogger(log), WithWorkers(2), WithObserver(Observer[int]{
		Accepted:       func(int, Mono) { boom() },
		AttemptStarted: func(int, AttemptInfo) { boom() },
		AttemptEnded:   func(int, AttemptInfo) { boom() },
		DeadLettered:   func(int, Mono, error) { boom() },
	}), WithDeadLetter(func(DeadLetter[int]) {}))
	require.NoError(t, err)
	ctx := watchdog(t)
	var cs []*Completion
	for i := range 20 {
		c, err := s.Submit(ctx, i%3, func(context.Context) error {
			if i == 7 {
				return errFail
			}
			return nil
		})
		require.NoError(t, err)
		cs = append(cs, c)
	}
	for i, c := range cs {
		if i == 7 {
			require.ErrorIs(t, c.Wait(ctx), errFail)
		} else {
			require.NoError(t, c.Wait(ctx))
		}
	}
	require.NoError(t, s.Close(ctx))
	st := s.Stats()
	require.EqualValues(t, 19, st.Succeeded)
	require.EqualValues(t, 1, st.Failed)
	assertAccounting(t, st)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, bytes.Count(buf.Bytes(), []byte("Observer function panicked")), buf.String())
	require.Contains(t, buf.String(), "observer bug")
}

func TestObserverOptionErrors(t *testing.T) {
	_, err := New[string](WithObserver(Observer[int]{Accepted: func(int, Mono) {}}))
	require.ErrorIs(t, err, ErrInvalidOption)
	require.Contains(t, err.Error(), "Observer[int]")
	// An observer with no function is accepted and costs nothing.
	s := newSched[string](t, WithObserver(Observer[string]{}))
	require.Nil(t, s.obs)
	require.True(t, s.cfg.taskAges)
}

// Ages: OldestAge is the age of the oldest unfinished task (running, queued,
// retrying or parked), KeyAge a key's head's, Keys orders keys by depth.
func TestAgesAndKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newBubbleSched[string](t, WithWorkers(4), WithTaskAges(), WithFailurePolicy(Park),
			WithDeadLetter(func(DeadLetter[string]) {}))
		ctx := context.Background()
		require.Zero(t, s.OldestAge())
		require.Empty(t, s.Keys(10))

		release := make(chan struct{})
		block := func(context.Context) error { <-release; return nil }
		nop := func(context.Context) error { return nil }
		// t=0: "stuck" holds a running task and 3 queued.
		for range 4 {
			_, err := s.Submit(ctx, "stuck", block)
			require.NoError(t, err)
		}
		time.Sleep(10 * time.Second)
		// t=10s: "parked" fails and parks, with one task behind it.
		_, err := s.Submit(ctx, "parked", func(context.Context) error { return errFail })
		require.NoError(t, err)
		_, err = s.Submit(ctx, "parked", nop)
		require.NoError(t, err)
		synctest.Wait()
		time.Sleep(5 * time.Second)
		// t=15s: "young" has one running task.
		_, err = s.Submit(ctx, "young", block)
		require.NoError(t, err)
		time.Sleep(time.Second)
		// t=16s: a one-shot key has come and gone.
		c, err := s.Submit(ctx, "gone", nop)
		require.NoError(t, err)
		require.NoError(t, c.Wait(ctx))
		synctest.Wait()

		require.Equal(t, 16*time.Second, s.OldestAge())
		require.Equal(t, 16*time.Second, s.KeyAge("stuck"))
		require.Equal(t, 6*time.Second, s.KeyAge("parked"))
		require.Equal(t, time.Second, s.KeyAge("young"))
		require.Zero(t, s.KeyAge("gone"))
		require.Zero(t, s.KeyAge("never"))

		want := []KeyInfo[string]{
			{Key: "stuck", Depth: 4, HeadAge: 16 * time.Second},
			{Key: "parked", Depth: 2, Parked: true, HeadAge: 6 * time.Second},
			{Key: "young", Depth: 1, HeadAge: time.Second},
		}
		require.Equal(t, want, s.Keys(0))
		require.Equal(t, want, s.Keys(-1))
		require.Equal(t, want[:2], s.Keys(2))
		require.Equal(t, want[:1], s.Keys(1))
		require.Equal(t, want, s.Keys(100))

		// The stuck key's first task finishes: its head is now a task
		// accepted at t=0 too; then the whole key drains.
		release <- struct{}{}
		synctest.Wait()
		require.Equal(t, 3, s.KeyDepth("stuck"))
		require.Equal(t, 16*time.Second, s.KeyAge("stuck"))
		close(release)
		synctest.Wait()
		require.Zero(t, s.KeyAge("stuck"))
		require.Zero(t, s.KeyAge("young"))
		require.Equal(t, 6*time.Second, s.OldestAge(), "the parked key's head is the oldest now")
		require.NoError(t, s.Skip("parked"))
		synctest.Wait()
		require.Zero(t, s.OldestAge())
		require.Empty(t, s.Keys(0))
	})
}

// A task waiting out a retry backoff is unfinished: it counts in the ages.
func TestAgesCountRetryingTasks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newBubbleSched[int](t, WithTaskAges(), WithDeadLetter(func(DeadLetter[int]) {}),
			WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour, MaxBackoff: time.Hour}))
		c, err := s.Submit(context.Background(), 1, func(context.Context) error { return errFail })
		require.NoError(t, err)
		synctest.Wait()
		start := time.Now()
		time.Sleep(time.Minute)
		if c.Err() == nil { // still waiting (the drawn backoff may be under a minute)
			require.Equal(t, time.Since(start), s.OldestAge())
			require.Equal(t, []KeyInfo[int]{{Key: 1, Depth: 1, HeadAge: time.Minute}}, s.Keys(1))
		}
		require.ErrorIs(t, c.Wait(context.Background()), errFail)
	})
}

// Without WithTaskAges or an observer, ages are 0 and Keys still reports
// depths and parking.
func TestKeysWithoutAges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newBubbleSched[int](t, WithWorkers(1))
		release := make(chan struct{})
		for k := range 3 {
			for range k + 1 {
				_, err := s.Submit(context.Background(), k, func(context.Context) error { <-release; return nil })
				require.NoError(t, err)
			}
		}
		time.Sleep(time.Minute)
		require.Zero(t, s.OldestAge())
		require.Zero(t, s.KeyAge(0))
		require.Equal(t, []KeyInfo[int]{{Key: 2, Depth: 3}, {Key: 1, Depth: 2}, {Key: 0, Depth: 1}}, s.Keys(0))
		close(release)
	})
}

// Keys(n) keeps the n deepest keys of many (the heap), the same as sorting
// them all and cutting.
func TestKeysTopN(t *testing.T) {
	s := newSched[int](t, WithWorkers(1), WithMaxKeyDepth(64))
	ctx := watchdog(t)
	release := make(chan struct{})
	block := func(context.Context) error { <-release; return nil }
	_, err := s.Submit(ctx, -1, block) // holds the only worker
	require.NoError(t, err)
	depths := map[int]int{-1: 1}
	for k := range 300 {
		d := 1 + rand.IntN(40)
		depths[k] = d
		for range d {
			_, err := s.Submit(ctx, k, block)
			require.NoError(t, err)
		}
	}
	all := s.Keys(0)
	require.Len(t, all, len(depths))
	for _, ki := range all {
		require.Equal(t, depths[ki.Key], ki.Depth, "key %d", ki.Key)
	}
	require.True(t, slices.IsSortedFunc(all, func(a, b KeyInfo[int]) int { return b.Depth - a.Depth }))
	for _, n := range []int{1, 2, 7, 50, 299, 301, 1000} {
		top := s.Keys(n)
		require.Len(t, top, min(n, len(all)))
		for i := range top {
			require.Equal(t, all[i].Depth, top[i].Depth, "n=%d i=%d", n, i)
		}
	}
	close(release)
	require.NoError(t, s.Drain(ctx))
	require.Empty(t, s.Keys(5))
}

// Keys and OldestAge run concurrently with submitters and workers (the race
// detector checks the reads of heads and stamps).
func TestKeysConcurrent(t *testing.T) {
	s := newSched[int](t, WithWorkers(2), WithTaskAges())
	ctx := watchdog(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, ki := range s.Keys(8) {
				require.Positive(t, ki.Depth)
				require.GreaterOrEqual(t, ki.HeadAge, time.Duration(0))
			}
			require.GreaterOrEqual(t, s.OldestAge(), time.Duration(0))
		}
	}()
	for i := range 20000 {
		_, err := s.Submit(ctx, i%97, func(context.Context) error { return nil })
		require.NoError(t, err)
	}
	require.NoError(t, s.Drain(ctx))
	close(stop)
	wg.Wait()
	require.Zero(t, s.OldestAge())
}

// SubmitBatch on a scheduler that stamps tasks: every task is stamped and
// reported Accepted, ages are right, and the batch's contract holds (a
// prefix accepted, refused items counted, the error naming the first).
func TestBatchWithAges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var rec obsRecorder
		s := newBubbleSched[string](t, WithObserver(rec.observer()), WithMaxKeyDepth(3), WithWorkers(2))
		ctx := context.Background()
		release := make(chan struct{})
		block := func(context.Context) error { <-release; return nil }
		cs, err := s.SubmitBatch(ctx, []BatchItem[string]{{"a", block}, {"a", block}, {"b", block}})
		require.NoError(t, err)
		require.Len(t, cs, 3)
		time.Sleep(time.Minute)
		cs2, err := s.TrySubmitBatch(ctx, []BatchItem[string]{{"c", block}, {"a", block}, {"a", block}, {"d", block}})
		require.ErrorIs(t, err, ErrKeyFull)
		require.ErrorContains(t, err, "2 of 4 tasks accepted, item 2 refused")
		require.Len(t, cs2, 2)
		st := s.Stats()
		require.EqualValues(t, 5, st.Submitted)
		require.EqualValues(t, 2, st.Rejected)
		time.Sleep(time.Minute)
		require.Equal(t, []KeyInfo[string]{
			{Key: "a", Depth: 3, HeadAge: 2 * time.Minute},
			{Key: "b", Depth: 1, HeadAge: 2 * time.Minute},
			{Key: "c", Depth: 1, HeadAge: time.Minute},
		}, s.Keys(0))
		acc, _ := split(rec.of("a"))
		require.Len(t, acc, 3)
		close(release)
		require.NoError(t, s.Drain(ctx))
	})
}

// A runner that goes straight on to its key's next task reuses the clock
// reading its previous attempt ended with as the next one's start (one clock
// read per task, not two), but never after a failed attempt: the failure's
// handling (here a dead-letter function that takes 2 s) is not the next
// task's queue wait lost, and the next task starts after it.
func TestObserverHandOverAfterFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var rec obsRecorder
		s := newBubbleSched[string](t, WithWorkers(1), WithObserver(rec.observer()),
			WithDeadLetter(func(DeadLetter[string]) { time.Sleep(2 * time.Second) }))
		ctx := context.Background()
		gate := make(chan struct{})
		_, err := s.Submit(ctx, "k", func(context.Context) error { <-gate; return nil })
		require.NoError(t, err)
		_, err = s.Submit(ctx, "k", func(context.Context) error { time.Sleep(time.Second); return nil })
		require.NoError(t, err)
		_, err = s.Submit(ctx, "k", func(context.Context) error { return Permanent(errFail) })
		require.NoError(t, err)
		_, err = s.Submit(ctx, "k", func(context.Context) error { return nil })
		require.NoError(t, err)
		close(gate)
		require.NoError(t, s.Drain(ctx))
		_, k := split(rec.of("k"))
		require.Equal(t, []string{"started", "ended", "started", "ended", "started", "ended", "dead", "started", "ended"}, kinds(k))
		require.Equal(t, k[1].a.Ended, k[2].a.Started, "after a success: handed over")
		require.Equal(t, time.Second, k[3].a.Ended.Sub(k[3].a.Started))
		require.Equal(t, 2*time.Second, k[7].a.Started.Sub(k[5].a.Ended),
			"after a failure the next start is read anew, after its dead letter")
	})
}

// Under real concurrency (a submitter appending to the key a runner drains,
// so that tasks arrive while it hands the key over), every attempt's times
// are in order: Accepted <= Started <= Ended, and each task of a key starts
// no earlier than its predecessor ended.
func TestObserverTimesInOrder(t *testing.T) {
	var mu sync.Mutex
	type times struct{ acc, start, end Mono }
	got := map[int][]times{}
	obs := Observer[int]{
		AttemptEnded: func(k int, a AttemptInfo) {
			mu.Lock()
			got[k] = append(got[k], times{a.Accepted, a.Started, a.Ended})
			mu.Unlock()
		},
	}
	s, err := New[int](WithLogger(quiet), WithWorkers(2), WithObserver(obs))
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close(context.Background())) }()
	ctx := context.Background()
	const keys, perKey = 4, 3000
	for i := range keys * perKey {
		_, err := s.Submit(ctx, i%keys, func(context.Context) error { return nil })
		require.NoError(t, err)
	}
	require.NoError(t, s.Drain(ctx))
	mu.Lock()
	defer mu.Unlock()
	for k, ts := range got {
		require.Len(t, ts, perKey)
		for i, x := range ts {
			require.LessOrEqual(t, x.acc, x.start, "key %d task %d: started before accepted", k, i)
			require.LessOrEqual(t, x.start, x.end, "key %d task %d", k, i)
			if i > 0 {
				require.LessOrEqual(t, ts[i-1].end, x.start, "key %d task %d: started before its predecessor ended", k, i)
			}
		}
	}
}

// A task accepted after its predecessor's attempt ended (while the runner
// was still handing the key on) does not get that older reading as its
// start: its start is read anew, after its acceptance.
func TestObserverHandOverNotBeforeAccepted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var rec obsRecorder
		first := true
		o := rec.observer()
		ended := o.AttemptEnded
		o.AttemptEnded = func(k string, a AttemptInfo) {
			ended(k, a)
			if first {
				first = false
				time.Sleep(time.Second) // the hand-over is slow: B arrives meanwhile
			}
		}
		s := newBubbleSched[string](t, WithWorkers(1), WithObserver(o))
		ctx := context.Background()
		_, err := s.Submit(ctx, "k", func(context.Context) error { return nil })
		require.NoError(t, err)
		time.Sleep(time.Second / 2)
		_, err = s.Submit(ctx, "k", func(context.Context) error { return nil })
		require.NoError(t, err)
		require.NoError(t, s.Drain(ctx))
		_, k := split(rec.of("k"))
		require.Equal(t, []string{"started", "ended", "started", "ended"}, kinds(k))
		b := k[3].a
		require.Equal(t, time.Second/2, b.Accepted.Sub(k[1].a.Ended))
		require.Equal(t, time.Second/2, b.Started.Sub(b.Accepted), "started when the hand-over ended, not before acceptance")
	})
}
