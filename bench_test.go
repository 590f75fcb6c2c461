package keysched

import (
	"context"
	"runtime"
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
	// The closures are made once per run, outside the loop, for every rival.
	rivals := []struct {
		name string
		make func(n int) benchRival
	}{
		{"keysched", func(n int) benchRival {
			s, err := New[int](WithWorkers(benchWorkers()), WithMaxPending(n+benchKeys), WithMaxKeyDepth(n+1))
			if err != nil {
				b.Fatal(err)
			}
			return ksRival{s}
		}},
		{"striped", func(n int) benchRival {
			// Every lane can hold every task: keys do not spread evenly.
			return stripedRival{striped.New[int](benchWorkers(), n+benchKeys)}
		}},
		{"ants", func(int) benchRival {
			p, err := antspool.New[int](benchWorkers())
			if err != nil {
				b.Fatal(err)
			}
			return antsRival{p}
		}},
	}
	for _, mode := range []string{"backlog", "stream"} {
		for _, rv := range rivals {
			b.Run("mode="+mode+"/sched="+rv.name, func(b *testing.B) {
				ctx := context.Background()
				r := rv.make(b.N)
				var ran atomic.Int64
				open := make(chan struct{})
				b.ReportAllocs()
				b.ResetTimer()
				cpu := startCPU(b)
				if mode == "backlog" {
					// Hold every worker: keys benchKeys.. are not used below.
					for w := range benchWorkers() {
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
				if err := r.finish(ctx); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				cpu.stop()
				if ran.Load() != int64(b.N) {
					b.Fatalf("ran %d of %d", ran.Load(), b.N)
				}
			})
		}
	}
}

// BenchmarkBatch compares, per task, 64 single Submits with one SubmitBatch
// of 64, on the no-op workload over benchKeys keys (consecutive tasks on
// different keys: no runs of one key to link together).
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
	for _, phase := range []string{"submit", "all"} {
		for _, how := range []string{"single", "batch64"} {
			b.Run("phase="+phase+"/submit="+how, func(b *testing.B) {
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
							if _, err := s.Submit(ctx, (i+j)%benchKeys, task); err != nil {
								b.Fatal(err)
							}
						}
						continue
					}
					for j := range m {
						items[j] = BatchItem[int]{Key: (i + j) % benchKeys, Task: task}
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
				ctx := context.Background()
				opts := append([]Option{WithWorkers(benchWorkers()), WithMaxPending(b.N + benchKeys),
					WithMaxKeyDepth(b.N + 1)}, v.opts...)
				s, err := New[int](opts...)
				if err != nil {
					b.Fatal(err)
				}
				r := ksRival{s}
				var ran atomic.Int64
				open := make(chan struct{})
				b.ReportAllocs()
				b.ResetTimer()
				if mode == "backlog" {
					for w := range benchWorkers() {
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
				if err := r.finish(ctx); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if ran.Load() != int64(b.N) {
					b.Fatalf("ran %d of %d", ran.Load(), b.N)
				}
			})
		}
	}
}
