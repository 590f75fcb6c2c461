package bus

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keysched/keysched"
)

// The benchmarks compare, in one process, as ratios (absolute times drift on
// shared machines):
//
//	go test -run '^$' -bench . -benchmem -count 10 ./bus | tee bus.txt
//	benchstat -col /sched bus.txt
//	benchstat -col /sub bus.txt
const benchKeys = 10_000

func benchWorkers() int { return runtime.GOMAXPROCS(0) }

type benchEvent struct{ N int }

// BenchmarkPublish is the bus's overhead over the bare scheduler: the same
// no-op workload (one publisher far ahead of the workers, benchKeys keys)
// through keysched.Submit and through a bus with one subscriber.
func BenchmarkPublish(b *testing.B) {
	ctx := context.Background()
	b.Run("sched=keysched", func(b *testing.B) {
		s, err := keysched.New[int](keysched.WithWorkers(benchWorkers()),
			keysched.WithMaxPending(1<<22), keysched.WithMaxKeyDepth(1<<22))
		if err != nil {
			b.Fatal(err)
		}
		var ran atomic.Int64
		task := func(context.Context) error { ran.Add(1); return nil }
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, err := s.Submit(ctx, i%benchKeys, task); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.Drain(ctx); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := s.Close(ctx); err != nil {
			b.Fatal(err)
		}
		if ran.Load() != int64(b.N) {
			b.Fatalf("ran %d of %d", ran.Load(), b.N)
		}
	})
	b.Run("sched=bus", func(b *testing.B) {
		bs, err := New[int](WithWorkers(benchWorkers()), WithLogger(quiet))
		if err != nil {
			b.Fatal(err)
		}
		var ran atomic.Int64
		sub, err := Subscribe(bs, "only", func(context.Context, Envelope[int], benchEvent) error {
			ran.Add(1)
			return nil
		}, MaxPending(1<<22), MaxKeyDepth(1<<22))
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if err := bs.Publish(ctx, i%benchKeys, benchEvent{i}); err != nil {
				b.Fatal(err)
			}
		}
		if err := sub.Drain(ctx); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := bs.Close(ctx); err != nil {
			b.Fatal(err)
		}
		if ran.Load() != int64(b.N) {
			b.Fatalf("ran %d of %d", ran.Load(), b.N)
		}
	})
}

type slowEvent struct{}

// BenchmarkBulkhead measures a subscriber's throughput (events/s) alone on
// the bus, and beside a slow subscriber (each handler blocks 1ms, as on I/O)
// kept saturated by a background publisher but bulkheaded with
// MaxConcurrency(2). With the bulkhead the slow one holds at most 2 of the
// pool's workers, so the fast one's throughput should stay within noise of
// running alone, given workers to spare.
func BenchmarkBulkhead(b *testing.B) {
	const workers = 8
	for _, beside := range []bool{false, true} {
		name := "sub=alone"
		if beside {
			name = "sub=beside-slow"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			bs, err := New[int](WithWorkers(workers), WithLogger(quiet))
			if err != nil {
				b.Fatal(err)
			}
			fast, err := Subscribe(bs, "fast", func(context.Context, Envelope[int], benchEvent) error {
				return nil
			}, MaxPending(1<<22), MaxKeyDepth(1<<22))
			if err != nil {
				b.Fatal(err)
			}
			stop := make(chan struct{})
			var feeder sync.WaitGroup
			if beside {
				slow, err := Subscribe(bs, "slow", func(context.Context, Envelope[int], slowEvent) error {
					time.Sleep(time.Millisecond)
					return nil
				}, MaxConcurrency(2), MaxPending(64))
				if err != nil {
					b.Fatal(err)
				}
				// Keep the slow subscriber saturated: Block makes the feeder
				// wait at MaxPending, so it costs little CPU.
				feeder.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						_ = bs.Publish(ctx, i%64, slowEvent{})
					}
				})
				for slow.Stats().Running < 2 { // saturated before the clock starts
					runtime.Gosched()
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				if err := bs.Publish(ctx, i%1000, benchEvent{i}); err != nil {
					b.Fatal(err)
				}
			}
			if err := fast.Drain(ctx); err != nil {
				b.Fatal(err)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
			close(stop)
			feeder.Wait()
			if err := bs.Close(ctx); err != nil {
				b.Fatal(err)
			}
		})
	}
}
