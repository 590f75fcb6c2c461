// Mixed load: many keys, retries, panics, parks, snoozes and an aborting
// Close at once, checking every invariant together (order, one outcome per
// task, Stats settled, no leak). Found by attacking the code: an adversarial
// review wrote these to break the scheduler under load.

package keysched

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Adversarial stress tests: concurrent mixes of Submit, TrySubmit,
// SubmitBatch, TrySubmitBatch, Cancel, retries, Park with Resume and Skip, and
// Close, checked for order within a key, overlap, accounting, and that a done
// Completion never changes.

type stressTask struct {
	sub, key, seq int
	started       atomic.Int32
}

type stressRec struct {
	mu       sync.Mutex
	lastSeq  map[[2]int]int // (submitter, key) -> seq of the last task to start its first attempt
	orderErr []string
	running  []atomic.Int32 // per key
	overlap  atomic.Int64
}

func (r *stressRec) run(t *stressTask, fail bool, panicking bool) error {
	if r.running[t.key].Add(1) != 1 {
		r.overlap.Add(1)
	}
	defer r.running[t.key].Add(-1)
	if t.started.Add(1) == 1 {
		r.mu.Lock()
		k := [2]int{t.sub, t.key}
		if last, ok := r.lastSeq[k]; ok && last >= t.seq {
			r.orderErr = append(r.orderErr, fmt.Sprintf("sub %d key %d: seq %d started after %d", t.sub, t.key, t.seq, last))
		}
		r.lastSeq[k] = t.seq
		r.mu.Unlock()
	}
	if panicking {
		panic("boom")
	}
	if fail {
		return errFlaky
	}
	return nil
}

func stressSched(t *testing.T, park bool, extra ...Option) (*Scheduler[int], *atomic.Int64) {
	var letters atomic.Int64
	opts := []Option{
		WithWorkers(3), WithMaxKeyDepth(3), WithMaxPending(16),
		WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: 50 * time.Microsecond}),
		WithDeadLetter(func(DeadLetter[int]) { letters.Add(1) }),
	}
	if park {
		opts = append(opts, WithFailurePolicy(Park))
	}
	s, err := New[int](append(append([]Option{WithLogger(quiet)}, opts...), extra...)...)
	require.NoError(t, err)
	return s, &letters
}

// stressLoad runs submitters against s until stop is closed or each has made
// rounds submissions, cancelling some tasks and resolving parked keys. It
// returns every accepted Completion.
func stressLoad(t *testing.T, s *Scheduler[int], rec *stressRec, keys, subs, rounds int, stop <-chan struct{}) []*Completion {
	var mu sync.Mutex
	var all []*Completion
	var wg sync.WaitGroup
	cancels := make(chan *Completion, 64)
	for sub := range subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(sub), 7))
			seq := 0
			mk := func(key int) Task {
				seq++
				st := &stressTask{sub: sub, key: key, seq: seq}
				fail := rng.IntN(6) == 0
				pan := rng.IntN(20) == 0
				return func(ctx context.Context) error { return rec.run(st, fail, pan) }
			}
			for range rounds {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(3))*time.Millisecond)
				var got []*Completion
				switch rng.IntN(4) {
				case 0:
					key := rng.IntN(keys)
					if c, err := s.Submit(ctx, key, mk(key)); err == nil {
						got = append(got, c)
					}
				case 1:
					key := rng.IntN(keys)
					if c, err := s.TrySubmit(ctx, key, mk(key)); err == nil {
						got = append(got, c)
					}
				default:
					items := make([]BatchItem[int], 1+rng.IntN(6))
					for i := range items {
						if i > 0 && rng.IntN(2) == 0 {
							items[i].Key = items[i-1].Key
						} else {
							items[i].Key = rng.IntN(keys)
						}
						items[i].Task = mk(items[i].Key)
					}
					if rng.IntN(2) == 0 {
						got, _ = s.SubmitBatch(ctx, items)
					} else {
						got, _ = s.TrySubmitBatch(ctx, items)
					}
				}
				cancel()
				for _, c := range got {
					if rng.IntN(8) == 0 {
						select {
						case cancels <- c:
						default:
						}
					}
				}
				mu.Lock()
				all = append(all, got...)
				mu.Unlock()
			}
		}()
	}
	done := make(chan struct{})
	var helpers sync.WaitGroup
	helpers.Add(2)
	go func() { // canceller
		defer helpers.Done()
		for {
			select {
			case c := <-cancels:
				c.Cancel()
			case <-done:
				return
			}
		}
	}()
	go func() { // resolver of parked keys
		defer helpers.Done()
		rng := rand.New(rand.NewPCG(99, 7))
		resolveParked(s, rng, done, 50*time.Microsecond)
	}()
	wg.Wait()
	// Keep resolving until the scheduler drains (parked keys hold it).
	require.NoError(t, s.Drain(watchdog(t)))
	close(done)
	helpers.Wait()
	return all
}

// obsCheck is an Observer that checks each task's events are consistent:
// attempts numbered from 1 without gaps, each ended after it started, and
// never two attempts of one key at once.
type obsCheck struct {
	mu      sync.Mutex
	open    map[int]int // key -> attempts started and not ended
	errs    []string
	events  atomic.Int64
	panicky bool
}

func (o *obsCheck) observer() Observer[int] {
	return Observer[int]{
		Accepted: func(key int, at Mono) {
			o.events.Add(1)
			if o.panicky && key == 0 {
				panic("observer panics")
			}
		},
		AttemptStarted: func(key int, a AttemptInfo) {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.open[key]++
			if o.open[key] != 1 {
				o.errs = append(o.errs, fmt.Sprintf("key %d: %d attempts at once", key, o.open[key]))
			}
			if a.N < 1 || a.Started < a.Accepted {
				o.errs = append(o.errs, fmt.Sprintf("key %d: bad start %+v", key, a))
			}
		},
		AttemptEnded: func(key int, a AttemptInfo) {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.open[key]--
			if a.Ended < a.Started {
				o.errs = append(o.errs, fmt.Sprintf("key %d: ended before started %+v", key, a))
			}
		},
		DeadLettered: func(key int, at Mono, err error) {
			if err == nil {
				o.mu.Lock()
				o.errs = append(o.errs, fmt.Sprintf("key %d: dead letter without error", key))
				o.mu.Unlock()
			}
		},
	}
}

// Submitters, cancels, retries, Park with Resume and Skip, with and
// without a checking Observer (one that panics too) and a task timeout,
// while Keys and the ages are read: each key's tasks start in order and
// never overlap, every Completion is done after Drain and never changes
// afterwards, and Stats settles.
//
// Written to attack the code under load (adversarial review, 2026-11-30, with
// the change for waits on tasks Cancel or Close's abort has taken, commit
// e5adb25).
func TestMixedLoadKeepsOrderAndSettles(t *testing.T) {
	type variant struct {
		name string
		park bool
		opts func(o *obsCheck) []Option
	}
	variants := []variant{
		{"continue", false, nil},
		{"park", true, nil},
		{"park+observer+timeout", true, func(o *obsCheck) []Option {
			return []Option{WithObserver(o.observer()), WithTaskTimeout(time.Second)}
		}},
		{"continue+panicky observer", false, func(o *obsCheck) []Option {
			o.panicky = true
			return []Option{WithObserver(o.observer())}
		}},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			const keys = 5
			park := v.park
			o := &obsCheck{open: map[int]int{}}
			var extra []Option
			if v.opts != nil {
				extra = v.opts(o)
			}
			s, letters := stressSched(t, park, extra...)
			stopInspect := make(chan struct{})
			inspected := make(chan struct{})
			go func() { // inspection calls while everything moves
				defer close(inspected)
				for {
					select {
					case <-stopInspect:
						return
					default:
					}
					for _, k := range s.Keys(3) {
						if k.Depth <= 0 || k.HeadAge < 0 {
							t.Errorf("bad KeyInfo %+v", k)
						}
					}
					_ = s.OldestAge()
					_ = s.KeyAge(1)
					_ = s.KeyDepth(2)
					time.Sleep(200 * time.Microsecond) // polling pace
				}
			}()
			rec := &stressRec{lastSeq: map[[2]int]int{}, running: make([]atomic.Int32, keys)}
			all := stressLoad(t, s, rec, keys, 4, 300, nil)
			require.Empty(t, rec.orderErr)
			require.Zero(t, rec.overlap.Load())
			errs := make([]error, len(all))
			for i, c := range all {
				select {
				case <-c.Done():
				default:
					t.Fatalf("completion %d not done after Drain", i)
				}
				errs[i] = c.Err()
			}
			st := s.Stats()
			assertAccounting(t, st)
			require.Zero(t, st.Keys, "%+v", st)
			require.Zero(t, st.ParkedKeys, "%+v", st)
			require.Equal(t, uint64(letters.Load()), st.DeadLettered)
			// More work, then the old Completions must not have changed.
			rec2 := &stressRec{lastSeq: map[[2]int]int{}, running: make([]atomic.Int32, keys)}
			stressLoad(t, s, rec2, keys, 2, 100, nil)
			for i, c := range all {
				require.Equal(t, errs[i], c.Err(), "completion %d changed", i)
			}
			close(stopInspect)
			<-inspected
			require.NoError(t, s.Close(watchdog(t)))
			st = s.Stats()
			assertAccounting(t, st)
			require.Zero(t, st.Keys)
			require.Empty(t, s.Keys(0))
			require.Zero(t, s.OldestAge())
			o.mu.Lock()
			require.Empty(t, o.errs)
			o.mu.Unlock()
		})
	}
}

// Written to attack the code under load (adversarial review, 2026-11-30, with
// the change for waits on tasks Cancel or Close's abort has taken, commit
// e5adb25).
//
// Close gives up while submitters, cancels, retries and parked keys are in
// flight: every accepted Completion is done eventually, each exactly with one
// outcome, and once all are done Stats is settled.
func TestCloseGivingUpUnderLoadSettles(t *testing.T) {
	for _, park := range []bool{false, true} {
		t.Run(fmt.Sprintf("park=%v", park), func(t *testing.T) {
			const keys = 6
			s, letters := stressSched(t, park)
			rec := &stressRec{lastSeq: map[[2]int]int{}, running: make([]atomic.Int32, keys)}
			var mu sync.Mutex
			var all []*Completion
			var wg sync.WaitGroup
			stopSub := make(chan struct{})
			for sub := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(sub), 11))
					seq := 0
					for {
						select {
						case <-stopSub:
							return
						default:
						}
						items := make([]BatchItem[int], 1+rng.IntN(5))
						for i := range items {
							seq++
							st := &stressTask{sub: sub, key: rng.IntN(keys), seq: seq}
							fail := rng.IntN(4) == 0
							items[i] = BatchItem[int]{Key: st.key, Task: func(ctx context.Context) error { return rec.run(st, fail, false) }}
						}
						ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
						var got []*Completion
						var err error
						if rng.IntN(2) == 0 {
							got, err = s.SubmitBatch(ctx, items)
						} else {
							c, e := s.Submit(ctx, items[0].Key, items[0].Task)
							err = e
							if c != nil {
								got = []*Completion{c}
							}
						}
						cancel()
						if len(got) > 0 && rng.IntN(5) == 0 {
							got[0].Cancel()
						}
						mu.Lock()
						all = append(all, got...)
						mu.Unlock()
						if errors.Is(err, ErrClosed) {
							return
						}
					}
				}()
			}
			// Let some work happen, then close with an already short context.
			// (Parked keys, never resolved here, may stop the flow short of
			// 200: then close after a while anyway.)
			for t0 := time.Now(); s.Stats().Submitted < 200 && time.Since(t0) < 300*time.Millisecond; {
				time.Sleep(100 * time.Microsecond) // polling pace
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
			err := s.Close(ctx)
			cancel()
			close(stopSub)
			wg.Wait()
			requireCloseSettles(t, s, err, all)
			require.Empty(t, rec.orderErr)
			require.Zero(t, rec.overlap.Load())
			st := s.Stats()
			assertAccounting(t, st)
			require.Zero(t, st.Keys, "%+v", st)
			require.Equal(t, uint64(letters.Load()), st.DeadLettered)
			require.Equal(t, uint64(len(all)), st.Submitted)
		})
	}
}
