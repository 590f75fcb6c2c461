package otelkeysched_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/otelkeysched"
)

// BenchmarkObserved is keysched's no-op benchmark (stream mode: the submitter
// and the workers run together, over 10 000 keys) without metrics and with
// otelkeysched on the OpenTelemetry SDK (the histograms recorded per task;
// the reader never collects, as between two scrapes). It reports cpu-ns/op,
// the process's CPU time per task, next to wall time:
//
//	go test -run '^$' -bench Observed -benchmem -count 8 ./otelkeysched | tee obs.txt
//	benchstat -col /metrics obs.txt
func BenchmarkObserved(b *testing.B) {
	for _, v := range []string{"none", "otel"} {
		b.Run("metrics="+v, func(b *testing.B) {
			ctx := context.Background()
			opts := []keysched.Option{keysched.WithWorkers(runtime.GOMAXPROCS(0)),
				keysched.WithMaxPending(b.N + 10_000), keysched.WithMaxKeyDepth(b.N + 1)}
			var mp *sdkmetric.MeterProvider
			if v == "otel" {
				mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
				defer mp.Shutdown(ctx)
				m, err := otelkeysched.New[int](mp)
				if err != nil {
					b.Fatal(err)
				}
				opts = append(opts, keysched.WithObserver(m.Observer()))
			}
			s, err := keysched.New[int](opts...)
			if err != nil {
				b.Fatal(err)
			}
			var ran atomic.Int64
			task := func(context.Context) error { ran.Add(1); return nil }
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			for i := range b.N {
				if _, err := s.Submit(ctx, i%10_000, task); err != nil {
					b.Fatal(err)
				}
			}
			if err := s.Close(ctx); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			if ran.Load() != int64(b.N) {
				b.Fatalf("ran %d of %d", ran.Load(), b.N)
			}
		})
	}
}
