package keysched

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// Duration arithmetic that overflows (issue 8, class 1).

// The inputs of the issue: a ceiling that reaches 2^63 ns wrapped to a
// negative delay on amd64 (all ten attempts in a hot loop), or handed
// rand.Int64N a negative bound elsewhere (a panic on a worker). The window is
// uniform over [0, MaxBackoff], so in one (fake) second at most the attempts
// whose ceiling is tiny run.
func TestHugeBackoffDoesNotHotLoop(t *testing.T) {
	for name, tc := range map[string]struct {
		p       RetryPolicy
		maxRuns int32
	}{
		// Attempt 2's window is [0, 1ns]; from attempt 3 on it is ~292 years.
		"multiplier 1e19":                {RetryPolicy{MaxAttempts: 10, InitialBackoff: time.Nanosecond, Multiplier: 1e19, MaxBackoff: math.MaxInt64}, 2},
		"initial MaxInt64":               {RetryPolicy{MaxAttempts: 10, InitialBackoff: math.MaxInt64}, 1},
		"initial MaxInt64, max MaxInt64": {RetryPolicy{MaxAttempts: 10, InitialBackoff: math.MaxInt64, MaxBackoff: math.MaxInt64, Multiplier: math.MaxFloat64}, 1},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s, err := New[int](WithLogger(quiet), WithRetry(tc.p))
				require.NoError(t, err)
				var runs atomic.Int32
				c, err := s.Submit(context.Background(), 1, func(context.Context) error {
					runs.Add(1)
					return errFail
				})
				require.NoError(t, err)
				time.Sleep(time.Second)
				synctest.Wait()
				require.LessOrEqual(t, runs.Load(), tc.maxRuns, "attempts in a hot loop")
				require.GreaterOrEqual(t, runs.Load(), int32(1))
				require.Zero(t, s.Stats().Panicked)
				ended, cancel := context.WithCancel(context.Background())
				cancel()
				require.ErrorIs(t, s.Close(ended), ErrAborted)
				require.ErrorIs(t, c.Wait(context.Background()), ErrAborted) // in its backoff
			})
		})
	}
}

// anyDuration draws from the whole time.Duration range, edges included.
func anyDuration(t *rapid.T, label string) time.Duration {
	return rapid.OneOf(
		rapid.Map(rapid.Int64(), func(v int64) time.Duration { return time.Duration(v) }),
		rapid.Map(rapid.Int64Range(0, 1<<40), func(v int64) time.Duration { return time.Duration(v) }),
		rapid.SampledFrom([]time.Duration{0, 1, -1, time.Minute, math.MaxInt64, math.MaxInt64 - 1, math.MinInt64, 1 << 62}),
	).Draw(t, label)
}

// For every RetryPolicy: either New refuses it with ErrInvalidOption, or
// every backoff ceiling and every drawn delay is in [0, cap], with no panic,
// for any attempt number.
func TestRetryPolicyDurationsProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := RetryPolicy{
			MaxAttempts:    rapid.OneOf(rapid.IntRange(-1, 20), rapid.SampledFrom([]int{math.MaxInt, math.MaxInt32, math.MinInt})).Draw(t, "maxAttempts"),
			InitialBackoff: anyDuration(t, "initial"),
			MaxBackoff:     anyDuration(t, "max"),
			Multiplier: rapid.OneOf(rapid.Float64(), rapid.Float64Range(1, 10),
				rapid.SampledFrom([]float64{0, 1, 2, 1e19, math.MaxFloat64, math.Inf(1), math.Inf(-1), math.NaN(), -1, 0.5, math.Nextafter(1, 0)}),
			).Draw(t, "multiplier"),
		}
		s, err := New[int](WithLogger(quiet), WithWorkers(1), WithRetry(p))
		if err != nil {
			if !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("New(%+v): %v, not ErrInvalidOption", p, err)
			}
			return
		}
		require.NoError(t, s.Close(context.Background()))
		if p.MaxAttempts <= 1 {
			return
		}
		limit := p.MaxBackoff
		if limit == 0 {
			limit = max(p.InitialBackoff, time.Minute)
		}
		for _, n := range []int{2, 3, rapid.IntRange(2, 200).Draw(t, "n"), 64, 1 << 20, math.MaxInt32, math.MaxInt} {
			c := p.ceiling(n)
			if c <= 0 || c > limit {
				t.Fatalf("ceiling(%d) = %d of %+v: want in (0, %d]", n, c, p, limit)
			}
			for range 3 {
				if d := p.delay(n); d < 0 || d > c {
					t.Fatalf("delay(%d) = %d of %+v: want in [0, %d]", n, d, p, c)
				}
			}
		}
		// The ceiling never shrinks from one attempt to the next.
		prev := time.Duration(0)
		for n := 2; n < 80; n++ {
			c := p.ceiling(n)
			if c < prev {
				t.Fatalf("ceiling(%d) = %d < ceiling(%d) = %d of %+v", n, c, n-1, prev, p)
			}
			prev = c
		}
	})
}

// WithTaskTimeout over its whole accepted range: the attempt's deadline is
// in the future, its context not ended at the start, never a deadline in the
// past from an overflow.
func TestTaskTimeoutDeadlineSaturates(t *testing.T) {
	for _, d := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1, 1 << 62, 100 * 365 * 24 * time.Hour} {
		s := newSched[int](t, WithTaskTimeout(d))
		before := time.Now()
		c, err := s.Submit(watchdog(t), 1, func(ctx context.Context) error {
			dl, ok := ctx.Deadline()
			if !ok || !dl.After(before) {
				return errors.New("deadline missing or in the past")
			}
			return ctx.Err()
		})
		require.NoError(t, err)
		require.NoError(t, c.Wait(watchdog(t)), "timeout %d", d)
	}
	_, err := New[int](WithTaskTimeout(0))
	require.ErrorIs(t, err, ErrInvalidOption)
	_, err = New[int](WithTaskTimeout(math.MinInt64))
	require.ErrorIs(t, err, ErrInvalidOption)
}
