package otelkeysched_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/otelkeysched"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreCurrent()) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// hist is a histogram data point, reduced to what the tests compare.
type hist struct {
	Count   uint64
	Sum     float64
	Buckets map[float64]uint64 // upper bound (+Inf for the last) -> count, non-zero buckets only
}

// collect reads every metric of the reader as "name{k=v,...}" -> value
// (int64 for sums, float64 for gauges, hist for histograms), and the units
// by name.
func collect(t *testing.T, r *sdkmetric.ManualReader) (map[string]any, map[string]string) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	vals, units := map[string]any{}, map[string]string{}
	id := func(name string, set attribute.Set) string {
		var kv []string
		for _, a := range set.ToSlice() {
			kv = append(kv, string(a.Key)+"="+a.Value.String())
		}
		return name + "{" + strings.Join(kv, ",") + "}"
	}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, otelkeysched.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			units[m.Name] = m.Unit
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					vals[id(m.Name, p.Attributes)] = p.Value
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					vals[id(m.Name, p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					h := hist{Count: p.Count, Sum: p.Sum, Buckets: map[float64]uint64{}}
					for i, c := range p.BucketCounts {
						if c == 0 {
							continue
						}
						ub := float64(1 << 62) // +Inf
						if i < len(p.Bounds) {
							ub = p.Bounds[i]
						}
						h.Buckets[ub] = c
					}
					vals[id(m.Name, p.Attributes)] = h
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return vals, units
}

// only keeps the values whose id contains every one of parts.
func only(vals map[string]any, parts ...string) map[string]any {
	out := map[string]any{}
	for k, v := range vals {
		keep := true
		for _, p := range parts {
			keep = keep && strings.Contains(k, p)
		}
		if keep {
			out[k] = v
		}
	}
	return out
}

var errFail = errors.New("failed")

// The known workload: successes, a failure, a retry, dead letters, parked
// keys, a slow key, a cancelled and a rejected submission, in fake time, give
// exactly the expected values at two collections; after Unregister the
// scheduler's series are gone and the histograms record nothing more.
func TestSchedulerMetricsExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := manualMeterProvider(t)
		m, err := otelkeysched.New[string](mp, otelkeysched.WithAttributes(attribute.String("scheduler", "ledger")))
		require.NoError(t, err)
		s, err := keysched.New[string](keysched.WithLogger(quiet), keysched.WithWorkers(4),
			keysched.WithObserver(m.Observer()), keysched.WithFailurePolicy(keysched.Park),
			keysched.WithDeadLetter(func(keysched.DeadLetter[string]) {}),
			keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second, MaxBackoff: time.Second}))
		require.NoError(t, err)
		defer func() { // bounded (in fake time): a failed check may leave keys parked
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s.Close(ctx)
		}()
		require.NoError(t, m.Register(s))
		require.ErrorIs(t, m.Register(s), otelkeysched.ErrRegistered)

		ctx := context.Background()
		submit := func(key string, task keysched.Task) *keysched.Completion {
			c, err := s.Submit(ctx, key, task)
			require.NoError(t, err)
			return c
		}
		nop := func(context.Context) error { return nil }
		// t=0. Successes: "a" x3, "b" x2.
		for _, k := range []string{"a", "a", "a", "b", "b"} {
			submit(k, nop)
		}
		// A retry: fails once, then succeeds.
		tries := 0
		submit("retry", func(context.Context) error {
			if tries++; tries == 1 {
				return errFail
			}
			return nil
		})
		// A failure and a panic: dead-lettered, their keys parked (one task
		// queued behind the failure).
		submit("fail", func(context.Context) error { return keysched.Permanent(errFail) })
		submit("fail", nop)
		submit("panic", func(context.Context) error { panic("boom") })
		// A slow key: 10 s, one task queued behind it, one cancelled.
		submit("slow", func(context.Context) error { time.Sleep(10 * time.Second); return nil })
		submit("slow", nop)
		submit("slow", nop).Cancel()
		// A rejected submission.
		_, err = s.TrySubmit(ctx, "a", nil)
		require.ErrorIs(t, err, keysched.ErrNilTask)
		synctest.Wait()
		time.Sleep(4 * time.Second) // t=4s: the retry is done, the slow task still runs
		synctest.Wait()

		vals, units := collect(t, reader)
		L := "scheduler=ledger"
		require.Equal(t, map[string]any{
			"keysched.tasks.pending{" + L + "}":                    int64(6), // slow x3 (a cancelled task counts until its key reaches it), fail x2, panic
			"keysched.tasks.running{" + L + "}":                    int64(1),
			"keysched.keys.live{" + L + "}":                        int64(3),
			"keysched.keys.parked{" + L + "}":                      int64(2),
			"keysched.tasks.finished{outcome=succeeded," + L + "}": int64(6),
			"keysched.tasks.finished{outcome=failed," + L + "}":    int64(0),
			"keysched.tasks.finished{outcome=panicked," + L + "}":  int64(0),
			"keysched.tasks.finished{outcome=cancelled," + L + "}": int64(1),
			"keysched.tasks.finished{outcome=aborted," + L + "}":   int64(0),
			"keysched.tasks.retried{" + L + "}":                    int64(1),
			"keysched.tasks.snoozed{" + L + "}":                    int64(0),
			"keysched.tasks.dead_lettered{" + L + "}":              int64(2),
			"keysched.tasks.rejected{" + L + "}":                   int64(1),
			"keysched.tasks.oldest_age{" + L + "}":                 4.0,
			"keysched.task.queue_wait{" + L + "}":                  hist{Count: 9, Sum: 0, Buckets: map[float64]uint64{0.0001: 9}},
			"keysched.task.duration{outcome=succeeded," + L + "}":  hist{Count: 6, Sum: 0, Buckets: map[float64]uint64{0.0001: 6}},
			"keysched.task.duration{outcome=failed," + L + "}":     hist{Count: 2, Sum: 0, Buckets: map[float64]uint64{0.0001: 2}},
			"keysched.task.duration{outcome=panicked," + L + "}":   hist{Count: 1, Sum: 0, Buckets: map[float64]uint64{0.0001: 1}},
		}, vals)
		require.Equal(t, map[string]string{
			"keysched.tasks.pending": "{task}", "keysched.tasks.running": "{task}",
			"keysched.keys.live": "{key}", "keysched.keys.parked": "{key}",
			"keysched.tasks.finished": "{task}", "keysched.tasks.retried": "{retry}", "keysched.tasks.snoozed": "{run}",
			"keysched.tasks.dead_lettered": "{task}", "keysched.tasks.rejected": "{task}",
			"keysched.tasks.oldest_age": "s", "keysched.task.queue_wait": "s", "keysched.task.duration": "s",
		}, units)

		// t=10s: the slow task ends; the tasks behind it and behind the
		// failure (once skipped) start after a 10 s queue wait.
		time.Sleep(6 * time.Second)
		require.NoError(t, s.Skip("fail"))
		require.NoError(t, s.Skip("panic"))
		require.NoError(t, s.Drain(ctx))
		vals, _ = collect(t, reader)
		require.Equal(t, map[string]any{
			"keysched.tasks.pending{" + L + "}":                    int64(0),
			"keysched.tasks.running{" + L + "}":                    int64(0),
			"keysched.keys.live{" + L + "}":                        int64(0),
			"keysched.keys.parked{" + L + "}":                      int64(0),
			"keysched.tasks.finished{outcome=succeeded," + L + "}": int64(9),
			"keysched.tasks.finished{outcome=failed," + L + "}":    int64(1),
			"keysched.tasks.finished{outcome=panicked," + L + "}":  int64(1),
			"keysched.tasks.finished{outcome=cancelled," + L + "}": int64(1),
			"keysched.tasks.finished{outcome=aborted," + L + "}":   int64(0),
			"keysched.tasks.retried{" + L + "}":                    int64(1),
			"keysched.tasks.snoozed{" + L + "}":                    int64(0),
			"keysched.tasks.dead_lettered{" + L + "}":              int64(2),
			"keysched.tasks.rejected{" + L + "}":                   int64(1),
			"keysched.tasks.oldest_age{" + L + "}":                 0.0,
			"keysched.task.queue_wait{" + L + "}":                  hist{Count: 11, Sum: 20, Buckets: map[float64]uint64{0.0001: 9, 10: 2}},
			"keysched.task.duration{outcome=succeeded," + L + "}":  hist{Count: 9, Sum: 10, Buckets: map[float64]uint64{0.0001: 8, 10: 1}},
			"keysched.task.duration{outcome=failed," + L + "}":     hist{Count: 2, Sum: 0, Buckets: map[float64]uint64{0.0001: 2}},
			"keysched.task.duration{outcome=panicked," + L + "}":   hist{Count: 1, Sum: 0, Buckets: map[float64]uint64{0.0001: 1}},
		}, vals)

		// Unregistered: the asynchronous series are gone at the next
		// collection, and the histograms record nothing more.
		require.NoError(t, m.Unregister())
		require.NoError(t, m.Unregister())
		require.ErrorIs(t, m.Register(s), otelkeysched.ErrUnregistered)
		submit("late", func(context.Context) error { time.Sleep(time.Second); return nil })
		require.NoError(t, s.Drain(ctx))
		vals, _ = collect(t, reader)
		var names []string
		for k := range vals {
			names = append(names, k[:strings.Index(k, "{")])
		}
		slices.Sort(names)
		require.Equal(t, []string{"keysched.task.duration", "keysched.task.duration", "keysched.task.duration", "keysched.task.queue_wait"},
			names, "only the histograms' cumulative totals remain")
		require.Equal(t, uint64(11), vals["keysched.task.queue_wait{"+L+"}"].(hist).Count)
		require.Equal(t, uint64(9), vals["keysched.task.duration{outcome=succeeded,"+L+"}"].(hist).Count,
			"the late task's run is not recorded")
	})
}

// Two schedulers on one MeterProvider, told apart by their constant
// attributes; no key ever appears in an attribute.
func TestTwoSchedulersAndNoKeys(t *testing.T) {
	reader, mp := manualMeterProvider(t)
	ctx := context.Background()
	for i, name := range []string{"x", "y"} {
		m, err := otelkeysched.New[string](mp, otelkeysched.WithAttributes(attribute.String("scheduler", name)))
		require.NoError(t, err)
		s, err := keysched.New[string](keysched.WithLogger(quiet), keysched.WithObserver(m.Observer()))
		require.NoError(t, err)
		require.NoError(t, m.Register(s))
		for j := range (i + 1) * 10 {
			_, err := s.Submit(ctx, fmt.Sprintf("secret-account-%d", j), func(context.Context) error { return nil })
			require.NoError(t, err)
		}
		require.NoError(t, s.Close(ctx))
		defer m.Unregister()
	}
	vals, _ := collect(t, reader)
	require.Equal(t, int64(10), vals["keysched.tasks.finished{outcome=succeeded,scheduler=x}"])
	require.Equal(t, int64(20), vals["keysched.tasks.finished{outcome=succeeded,scheduler=y}"])
	require.Equal(t, uint64(20), vals["keysched.task.queue_wait{scheduler=y}"].(hist).Count)
	for k := range vals {
		require.NotContains(t, k, "secret")
	}
}

// A run that returns keysched.Snooze is counted by keysched.tasks.snoozed
// and its duration recorded with outcome=snoozed, not as a failed attempt.
func TestSnoozedRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := manualMeterProvider(t)
		m, err := otelkeysched.New[string](mp, otelkeysched.WithAttributes(attribute.String("scheduler", "z")))
		require.NoError(t, err)
		s, err := keysched.New[string](keysched.WithLogger(quiet), keysched.WithObserver(m.Observer()))
		require.NoError(t, err)
		require.NoError(t, m.Register(s))
		defer m.Unregister()
		ctx := context.Background()
		runs := 0
		c, err := s.Submit(ctx, "k", func(context.Context) error {
			if runs++; runs <= 2 {
				return keysched.Snooze(errFail, time.Second)
			}
			return nil
		})
		require.NoError(t, err)
		require.NoError(t, c.Wait(ctx))
		require.NoError(t, s.Close(ctx))
		vals, units := collect(t, reader)
		require.Equal(t, int64(2), vals["keysched.tasks.snoozed{scheduler=z}"])
		require.Equal(t, "{run}", units["keysched.tasks.snoozed"])
		require.Equal(t, uint64(2), vals["keysched.task.duration{outcome=snoozed,scheduler=z}"].(hist).Count)
		require.Equal(t, uint64(1), vals["keysched.task.duration{outcome=succeeded,scheduler=z}"].(hist).Count)
		require.NotContains(t, vals, "keysched.task.duration{outcome=failed,scheduler=z}")
		require.Equal(t, int64(0), vals["keysched.tasks.retried{scheduler=z}"])
	})
}

func TestOptionErrors(t *testing.T) {
	mp := noop.NewMeterProvider()
	_, err := otelkeysched.New[int](nil)
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	_, err = otelkeysched.New[int](mp, nil)
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	_, err = otelkeysched.New[int](mp, otelkeysched.WithAttributes(attribute.String("outcome", "x")))
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	_, err = otelkeysched.New[int](mp, otelkeysched.WithAttributes(attribute.KeyValue{}))
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	m, err := otelkeysched.New[int](mp)
	require.NoError(t, err)
	require.ErrorIs(t, m.Register(nil), keysched.ErrInvalidOption)
	_, err = otelkeysched.RegisterSubscription(mp, nil)
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	_, err = otelkeysched.RegisterBus(mp, nil)
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	_, err = otelkeysched.RegisterBus(nil, nil)
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
}
