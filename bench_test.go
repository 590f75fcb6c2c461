package keysched

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keysched/keysched/internal/antspool"
	"github.com/keysched/keysched/internal/striped"
)

// The benchmarks below run the same no-op workload over benchKeys keys on
// three schedulers in one process, so that their ratios can be compared
// (absolute times drift on shared machines): keysched, striped lanes (one
// bounded channel and one goroutine per lane, lanes = workers) and a plain
// ants pool (every task submitted straight to ants; no order at all).
//
//   - mode=backlog: one submitter far ahead of the workers, so chains are
//     deep. Every worker is first held by a gate task; the b.N tasks are
//     submitted; the gates open; the time is submit plus drain. (The plain
//     pool has no queue to run ahead into: its Submit waits for a free
//     worker, so it runs as in stream mode.)
//   - mode=stream: the submitter and the workers run together. On two cores
//     the workers keep up, so most keys hold one task at a time: every task
//     starts and ends its key's chain (two map operations, a ready-queue trip).
//
// Compare runs with benchstat:
//
//	go test -run '^$' -bench NoOp -benchmem -count 10 | tee new.txt
//	benchstat -col /sched new.txt
const benchKeys = 10_000

func benchWorkers() int { return runtime.GOMAXPROCS(0) }

// cpuMeter reports, next to ns/op (wall time), cpu-ns/op: the CPU time the
// whole process (submitters, workers, the garbage collector) spent per task
// between start and stop. On a shared, oversubscribed machine wall time
// measures the neighbours as much as the code; CPU time per task much less.
type cpuMeter struct {
	b     *testing.B
	start time.Duration
}

func startCPU(b *testing.B) *cpuMeter { return &cpuMeter{b: b, start: processCPU()} }

func (m *cpuMeter) stop() {
	if d := processCPU() - m.start; d > 0 && m.b.N > 0 {
		m.b.ReportMetric(float64(d.Nanoseconds())/float64(m.b.N), "cpu-ns/op")
	}
}

type benchRival interface {
	submit(ctx context.Context, key int, ran *atomic.Int64) error
	gate(ctx context.Context, key int, open <-chan struct{}) error
	finish(ctx context.Context) error
}

type ksRival struct{ s *Scheduler[int] }

func (r ksRival) submit(ctx context.Context, key int, ran *atomic.Int64) error {
	_, err := r.s.Submit(ctx, key, func(context.Context) error { ran.Add(1); return nil })
	return err
}

func (r ksRival) gate(ctx context.Context, key int, open <-chan struct{}) error {
	_, err := r.s.Submit(ctx, key, func(context.Context) error { <-open; return nil })
	return err
}

func (r ksRival) finish(ctx context.Context) error {
	if err := r.s.Drain(ctx); err != nil {
		return err
	}
	return r.s.Close(ctx)
}

type stripedRival struct{ l *striped.Lanes[int] }

func (r stripedRival) submit(ctx context.Context, key int, ran *atomic.Int64) error {
	return r.l.Submit(ctx, key, func() { ran.Add(1) })
}

func (r stripedRival) gate(ctx context.Context, key int, open <-chan struct{}) error {
	return r.l.Submit(ctx, key, func() { <-open })
}

func (r stripedRival) finish(context.Context) error { r.l.Close(); return nil }

type antsRival struct{ p *antspool.Pool[int] }

func (r antsRival) submit(ctx context.Context, key int, ran *atomic.Int64) error {
	return r.p.Submit(ctx, key, func() { ran.Add(1) })
}

func (r antsRival) gate(context.Context, int, <-chan struct{}) error { return nil }

func (r antsRival) finish(context.Context) error { r.p.Close(); return nil }

func BenchmarkNoOp(b *testing.B) {
	benchNoOp(b, benchWorkers(), []string{"backlog", "stream"}, true)
}

// BenchmarkDeepChain is the deep-chain figure of issue 10: no-op tasks on
// benchKeys integer keys, one submitter far ahead of 16 workers (every one
// held by a gate until all tasks are submitted), keysched against the lanes
// (16 of them). Run it with the 400,000 tasks:
//
//	go test -run '^$' -bench DeepChain -benchmem -count 8 -benchtime 400000x . | tee deep.txt
//	benchstat -col /sched deep.txt
func BenchmarkDeepChain(b *testing.B) {
	benchNoOp(b, 16, []string{"backlog"}, false)
}

func benchNoOp(b *testing.B, nw int, modes []string, withAnts bool) {
	// The closures are made once per run, outside the loop, for every rival.
	rivals := []struct {
		name string
		make func(n int) benchRival
	}{
		{"keysched", func(n int) benchRival {
			s, err := New[int](WithWorkers(nw), WithMaxPending(n+benchKeys), WithMaxKeyDepth(n+1))
			if err != nil {
				b.Fatal(err)
			}
			return ksRival{s}
		}},
		{"striped", func(n int) benchRival {
			// Every lane can hold every task: keys do not spread evenly.
			return stripedRival{striped.New[int](nw, n+benchKeys)}
		}},
		{"ants", func(int) benchRival {
			p, err := antspool.New[int](nw)
			if err != nil {
				b.Fatal(err)
			}
			return antsRival{p}
		}},
	}
	if !withAnts {
		rivals = rivals[:2]
	}
	for _, mode := range modes {
		for _, rv := range rivals {
			b.Run("mode="+mode+"/sched="+rv.name, func(b *testing.B) {
				benchNoOpRun(b, rv.make(b.N), mode, nw)
			})
		}
	}
}

// benchNoOpRun times b.N no-op tasks on benchKeys keys through r: in mode
// "backlog" all submitted while nw gate tasks hold every worker (keys
// benchKeys.. are not used otherwise), then released; in mode "stream"
// submitted while the workers run.
func benchNoOpRun(b *testing.B, r benchRival, mode string, nw int) {
	ctx := context.Background()
	var ran atomic.Int64
	open := make(chan struct{})
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU(b)
	if mode == "backlog" {
		// Hold every worker: keys benchKeys.. are not used below.
		for w := range nw {
			if err := r.gate(ctx, benchKeys+w, open); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		close(open)
	}
	for i := range b.N {
		if err := r.submit(ctx, i%benchKeys, &ran); err != nil {
			b.Fatal(err)
		}
	}
	if mode == "backlog" {
		close(open)
	}
	finishTimed(ctx, b, r, cpu, &ran)
}

// finishTimed waits until r ran every task (the last of the timed work),
// stops the timer and the CPU meter, and checks that r ran b.N tasks.
func finishTimed(ctx context.Context, b *testing.B, r benchRival, cpu *cpuMeter, ran *atomic.Int64) {
	if err := r.finish(ctx); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	cpu.stop()
	if ran.Load() != int64(b.N) {
		b.Fatalf("ran %d of %d", ran.Load(), b.N)
	}
}

// BenchmarkBatch compares, per task, 64 single Submits with one SubmitBatch
// of 64, on the no-op workload over benchKeys keys: keys=distinct has
// consecutive tasks on different keys (no runs of one key to link
// together), keys=runs8 runs of 8 tasks of one key (as a partition's fetch
// often holds).
//
//   - phase=submit: every worker is held by a gate task while the tasks are
//     submitted; only the submissions are timed (the drain is not). This is
//     what batching changes: admission, allocation, ready-queue trips.
//
//   - phase=all: submit and drain, workers running alongside.
//
//     go test -run '^$' -bench Batch -benchmem -count 8 . | tee batch.txt
//     benchstat -col /submit batch.txt
func BenchmarkBatch(b *testing.B) {
	const size = 64
	for _, keys := range []string{"distinct", "runs8"} {
		run := 1
		if keys == "runs8" {
			run = 8
		}
		for _, phase := range []string{"submit", "all"} {
			for _, how := range []string{"single", "batch64"} {
				b.Run("keys="+keys+"/phase="+phase+"/submit="+how, func(b *testing.B) {
					ctx := context.Background()
					s, err := New[int](WithWorkers(benchWorkers()), WithMaxPending(b.N+benchKeys+size), WithMaxKeyDepth(b.N+1))
					if err != nil {
						b.Fatal(err)
					}
					var ran atomic.Int64
					task := func(context.Context) error { ran.Add(1); return nil }
					items := make([]BatchItem[int], size)
					open := make(chan struct{})
					if phase == "submit" {
						for w := range benchWorkers() {
							if _, err := s.Submit(ctx, benchKeys+w, func(context.Context) error { <-open; return nil }); err != nil {
								b.Fatal(err)
							}
						}
					}
					b.ReportAllocs()
					b.ResetTimer()
					cpu := startCPU(b)
					for i := 0; i < b.N; i += size {
						m := min(size, b.N-i)
						if how == "single" {
							for j := range m {
								if _, err := s.Submit(ctx, (i+j)/run%benchKeys, task); err != nil {
									b.Fatal(err)
								}
							}
							continue
						}
						for j := range m {
							items[j] = BatchItem[int]{Key: (i + j) / run % benchKeys, Task: task}
						}
						if _, err := s.SubmitBatch(ctx, items[:m]); err != nil {
							b.Fatal(err)
						}
					}
					if phase == "submit" {
						b.StopTimer()
						cpu.stop()
					}
					close(open)
					if err := s.Drain(ctx); err != nil {
						b.Fatal(err)
					}
					if phase != "submit" {
						b.StopTimer()
						cpu.stop()
					}
					if err := s.Close(ctx); err != nil {
						b.Fatal(err)
					}
					if ran.Load() != int64(b.N) {
						b.Fatalf("ran %d of %d", ran.Load(), b.N)
					}
				})
			}
		}
	}
}

// BenchmarkObserverCost is BenchmarkNoOp's keysched runs with the hook unset,
// with WithTaskAges, and with an Observer whose functions do nothing, side by
// side (compare with benchstat -col /obs):
//
//	go test -run '^$' -bench ObserverCost -benchmem -count 8 . | tee obs.txt
//	benchstat -col /obs obs.txt
func BenchmarkObserverCost(b *testing.B) {
	nop := Observer[int]{
		Accepted:       func(int, Mono) {},
		AttemptStarted: func(int, AttemptInfo) {},
		AttemptEnded:   func(int, AttemptInfo) {},
		DeadLettered:   func(int, Mono, error) {},
	}
	variants := []struct {
		name string
		opts []Option
	}{
		{"unset", nil},
		{"ages", []Option{WithTaskAges()}},
		{"nop", []Option{WithObserver(nop)}},
	}
	for _, mode := range []string{"backlog", "stream"} {
		for _, v := range variants {
			b.Run("mode="+mode+"/obs="+v.name, func(b *testing.B) {
				opts := append([]Option{WithWorkers(benchWorkers()), WithMaxPending(b.N + benchKeys),
					WithMaxKeyDepth(b.N + 1)}, v.opts...)
				s, err := New[int](opts...)
				if err != nil {
					b.Fatal(err)
				}
				benchNoOpRun(b, ksRival{s}, mode, benchWorkers())
			})
		}
	}
}

// BenchmarkSubmitters runs the no-op stream (submitters and workers at once,
// GOMAXPROCS workers or lanes, benchKeys keys) from 1, 2 and GOMAXPROCS
// submitting goroutines (deduplicated), as HTTP handlers publish in a
// service: keysched against the striped lanes. ns/op is per task.
//
//	go test -run '^$' -bench Submitters -benchmem -count 8 . | tee subs.txt
//	benchstat -col /sched subs.txt
//
// It is also the false-sharing guard: every task has the submitters CAS the
// pending bound's taken word and push to the ready queue, while the workers
// add to the freed counter and read the wake-up gates. Run it once more from
// a build with every cache-line pad empty, and compare:
//
//	go test -run '^$' -bench 'Submitters/.*/sched=keysched' -count 8 . > pad.txt
//	go test -tags keysched_nopad -run '^$' -bench 'Submitters/.*/sched=keysched' -count 8 . > nopad.txt
//	benchstat pad.txt nopad.txt
//
// The nopad build is the layout with false sharing: if the default build's
// figure comes near it, a field has moved onto a hot line (TestHotFieldsOnLinesOfTheirOwn
// checks the known ones statically).
func BenchmarkSubmitters(b *testing.B) {
	counts := []int{1}
	for _, n := range []int{2, runtime.GOMAXPROCS(0)} {
		if !slices.Contains(counts, n) {
			counts = append(counts, n)
		}
	}
	for _, subs := range counts {
		for _, name := range []string{"keysched", "striped"} {
			b.Run(fmt.Sprintf("submitters=%d/sched=%s", subs, name), func(b *testing.B) {
				ctx := context.Background()
				var r benchRival
				if name == "keysched" {
					s, err := New[int](WithWorkers(benchWorkers()), WithMaxPending(b.N+benchKeys), WithMaxKeyDepth(b.N+1))
					if err != nil {
						b.Fatal(err)
					}
					r = ksRival{s}
				} else {
					r = stripedRival{striped.New[int](benchWorkers(), b.N+benchKeys)}
				}
				var ran atomic.Int64
				b.ReportAllocs()
				b.ResetTimer()
				cpu := startCPU(b)
				var wg sync.WaitGroup
				for g := range subs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := g; i < b.N; i += subs {
							if err := r.submit(ctx, (i*7919)%benchKeys, &ran); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				finishTimed(ctx, b, r, cpu, &ran)
			})
		}
	}
}

// BenchmarkTaskContext measures what taskctx.go's cancelCtxKey probe saves:
// the deep-chain no-op workload (16 workers, tasks queued behind gates),
// submitted with a cancellable context, as a request handler's would be.
// ctx=probe is the scheduler as built; ctx=withoutcancel forces the fallback
// (context.WithoutCancel per submission, as if the probe found no key).
//
//	go test -run '^$' -bench TaskContext -benchmem -count 8 -benchtime 400000x . | tee ctx.txt
//	benchstat -col /ctx ctx.txt
func BenchmarkTaskContext(b *testing.B) {
	for _, how := range []string{"probe", "withoutcancel"} {
		b.Run("ctx="+how, func(b *testing.B) {
			if how == "withoutcancel" {
				saved := cancelCtxKey
				cancelCtxKey = nil // no scheduler is running: set before New, restored after Close
				defer func() { cancelCtxKey = saved }()
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			const workers = 16
			s, err := New[int](WithWorkers(workers), WithMaxPending(b.N+benchKeys), WithMaxKeyDepth(b.N+1))
			if err != nil {
				b.Fatal(err)
			}
			var ran atomic.Int64
			task := func(context.Context) error { ran.Add(1); return nil }
			open := make(chan struct{})
			b.ReportAllocs()
			b.ResetTimer()
			cpu := startCPU(b)
			for w := range workers {
				if _, err := s.Submit(ctx, benchKeys+w, func(context.Context) error { <-open; return nil }); err != nil {
					b.Fatal(err)
				}
			}
			for i := range b.N {
				if _, err := s.Submit(ctx, i%benchKeys, task); err != nil {
					b.Fatal(err)
				}
			}
			close(open)
			if err := s.Drain(ctx); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			cpu.stop()
			if err := s.Close(ctx); err != nil {
				b.Fatal(err)
			}
			if ran.Load() != int64(b.N) {
				b.Fatalf("ran %d of %d", ran.Load(), b.N)
			}
		})
	}
}
