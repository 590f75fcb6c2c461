// Options: each refusal an *OptionError naming the option, and how options
// meet (the rule on Option).

package keysched

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/panjf2000/ants/v2"
	"github.com/stretchr/testify/require"
)

// Every refusal of New is an *OptionError that names the refused option (and,
// for two options that cannot both hold, the other one), and matches
// ErrInvalidOption: code that wraps New tells the options apart with
// errors.As, never by the error's text.
func TestOptionErrorNamesTheRefusedOption(t *testing.T) {
	released, err := ants.NewPool(1)
	require.NoError(t, err)
	released.Release()
	shared, err := ants.NewPool(2)
	require.NoError(t, err)
	defer shared.Release()
	for _, tc := range []struct {
		opts         []Option
		option, with string
	}{
		{[]Option{WithWorkers(0)}, "WithWorkers", ""},
		{[]Option{WithPool(nil)}, "WithPool", ""},
		{[]Option{WithPool(released)}, "WithPool", ""},
		{[]Option{WithMaxKeyDepth(0)}, "WithMaxKeyDepth", ""},
		{[]Option{WithMaxPending(-1)}, "WithMaxPending", ""},
		{[]Option{WithMaxConcurrency(0)}, "WithMaxConcurrency", ""},
		{[]Option{WithLogger(nil)}, "WithLogger", ""},
		{[]Option{WithRetry(RetryPolicy{MaxAttempts: -1})}, "WithRetry", ""},
		{[]Option{WithTaskTimeout(0)}, "WithTaskTimeout", ""},
		{[]Option{WithDeadLetter[int](nil)}, "WithDeadLetter", ""},
		{[]Option{WithDeadLetter(func(DeadLetter[string]) {})}, "WithDeadLetter", ""},
		{[]Option{WithObserver(Observer[string]{})}, "WithObserver", ""},
		{[]Option{WithFailurePolicy(7)}, "WithFailurePolicy", ""},
		{[]Option{WithWorkers(1), nil}, "opts[1]", ""},
		{[]Option{WithWorkers(4), WithPool(shared)}, "WithWorkers", "WithPool"},
	} {
		_, err := New[int](tc.opts...)
		require.ErrorIs(t, err, ErrInvalidOption, tc.option)
		var oe *OptionError
		require.ErrorAs(t, err, &oe, tc.option)
		require.Equal(t, tc.option, oe.Option, err.Error())
		require.Equal(t, tc.with, oe.With, err.Error())
		require.NotEmpty(t, oe.Reason, err.Error())
		require.Contains(t, err.Error(), "keysched: invalid option: "+tc.option)
	}
}

// How options meet (the rule on Option): the last of a name wins; of two
// nested bounds given, the outer one applies; a default gives way to a bound
// given. Each row checks the bounds the scheduler really applies.
func TestOptionsMeetByOneRule(t *testing.T) {
	shared, err := ants.NewPool(4)
	require.NoError(t, err)
	defer shared.Release()
	unbounded, err := ants.NewPool(-1)
	require.NoError(t, err)
	defer unbounded.Release()
	for _, tc := range []struct {
		name             string
		opts             []Option
		workers          int32 // tasks of this scheduler running at once
		poolCap          int   // the pool's size
		depth, pending   int64
		outerAppliesFull bool // one key's tasks fill the scheduler before the key's depth
	}{
		{"defaults", nil, DefaultWorkers, DefaultWorkers, DefaultMaxKeyDepth, DefaultMaxPending, false},
		{"the last WithWorkers wins", []Option{WithWorkers(2), WithWorkers(3)}, 3, 3, DefaultMaxKeyDepth, DefaultMaxPending, false},
		{"the last WithMaxPending wins", []Option{WithMaxPending(10), WithMaxPending(20)}, DefaultWorkers, DefaultWorkers, DefaultMaxKeyDepth, 20, false},
		{"depth above pending: pending applies first", []Option{WithMaxKeyDepth(100), WithMaxPending(10)}, DefaultWorkers, DefaultWorkers, 100, 10, true},
		{"pending alone below the default depth", []Option{WithMaxPending(10)}, DefaultWorkers, DefaultWorkers, DefaultMaxKeyDepth, 10, true},
		{"depth alone above the default pending raises it", []Option{WithMaxKeyDepth(DefaultMaxPending + 5)}, DefaultWorkers, DefaultWorkers, DefaultMaxPending + 5, DefaultMaxPending + 5, false},
		{"concurrency above workers: workers apply", []Option{WithMaxConcurrency(1000), WithWorkers(4)}, 4, 4, DefaultMaxKeyDepth, DefaultMaxPending, false},
		{"concurrency alone above the default workers sizes the pool", []Option{WithMaxConcurrency(1000)}, 1000, 1000, DefaultMaxKeyDepth, DefaultMaxPending, false},
		{"concurrency alone one above the default workers sizes the pool", []Option{WithMaxConcurrency(DefaultWorkers + 1)}, DefaultWorkers + 1, DefaultWorkers + 1, DefaultMaxKeyDepth, DefaultMaxPending, false},
		{"concurrency alone below the default workers", []Option{WithMaxConcurrency(8)}, 8, DefaultWorkers, DefaultMaxKeyDepth, DefaultMaxPending, false},
		{"concurrency above a shared pool: the pool applies", []Option{WithPool(shared), WithMaxConcurrency(1000)}, 4, 4, DefaultMaxKeyDepth, DefaultMaxPending, false},
		{"concurrency bounds an unbounded pool", []Option{WithPool(unbounded), WithMaxConcurrency(1000)}, 1000, -1, DefaultMaxKeyDepth, DefaultMaxPending, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := append([]Option{WithLogger(slog.New(slog.DiscardHandler))}, tc.opts...)
			s, err := New[int](opts...)
			require.NoError(t, err)
			defer func() { require.NoError(t, s.Close(context.Background())) }()
			require.Equal(t, tc.workers, s.workers.max, "tasks at once")
			require.Equal(t, tc.poolCap, s.workers.pool.Cap(), "pool size")
			require.Equal(t, tc.depth, s.maxKeyDepth, "key depth")
			require.Equal(t, tc.pending, s.pending.max, "pending bound")
			if !tc.outerAppliesFull {
				return
			}
			// One key fills the whole scheduler: the pending bound, not the
			// key's depth, refuses the next task.
			release := make(chan struct{})
			defer close(release)
			for i := int64(0); i < tc.pending; i++ {
				_, err := s.TrySubmit(context.Background(), 1, func(context.Context) error { <-release; return nil })
				require.NoError(t, err)
			}
			_, err = s.TrySubmit(context.Background(), 1, func(context.Context) error { return nil })
			require.ErrorIs(t, err, ErrFull)
			require.False(t, errors.Is(err, ErrKeyFull), "the key's depth was never reached: %v", err)
		})
	}
}

// Found by attacking the code (adversarial review, 2026-11-30: first written as a failing reproducer).
//
// TestWithWorkersAboveMaxInt32RefusedOrRuns: options are "checked when New runs: a bad
// value makes New return an error wrapping ErrInvalidOption". WithWorkers(n)
// accepts any n >= 1, but workers.max is an int32 (pool.go newWorkers:
// w.max = int32(size)), and ants' capacity is an int32 too. WithWorkers(
// math.MaxInt) (a natural way to say "as many as needed") gives max == -1: no
// runner is ever started, every accepted task waits forever, Drain and Close
// hang. Expected: New fails with ErrInvalidOption, or the tasks run. Fix:
// reject n > math.MaxInt32 in WithWorkers (options.go) / clamp in newWorkers.
// The same holds for WithPool with a pool whose Cap() is clamped by ants.
//
// Status: failed on every run when found (deterministic); fixed since
// (WithWorkers rejects n > math.MaxInt32).
func TestWithWorkersAboveMaxInt32RefusedOrRuns(t *testing.T) {
	guard := hangGuard(t, 5*time.Second)
	for _, n := range []int{math.MaxInt, 1 << 32} {
		s, err := New[int](WithLogger(quiet), WithWorkers(n))
		if err != nil {
			if !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("WithWorkers(%d): %v", n, err)
			}
			continue
		}
		c, err := s.Submit(context.Background(), 1, func(context.Context) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		err = c.Wait(guard)
		_ = abortClose(s)
		if err != nil {
			t.Fatalf("WithWorkers(%d): New accepted it, but a submitted task never ran: %v", n, err)
		}
	}
}

// A module's refusal is an *OptionError with the module's sentinel in
// Sentinel: errors.Is matches that sentinel and ErrInvalidOption (and the
// cause), not another module's, and its text begins with the sentinel's;
// one errors.As finds it however the module wraps it.
func TestOptionErrorOfAModuleMatchesItsSentinel(t *testing.T) {
	module := errors.New("mod: invalid option")
	other := errors.New("other: invalid option")
	cause := errors.New("cause")
	var err error = &OptionError{Option: "WithX", Value: "0", Reason: "need at least 1", Sentinel: module, Err: cause}
	require.ErrorIs(t, err, module)
	require.ErrorIs(t, err, ErrInvalidOption)
	require.ErrorIs(t, err, cause)
	require.NotErrorIs(t, err, other)
	require.Equal(t, "mod: invalid option: WithX(0): need at least 1: cause", err.Error())
	var oe *OptionError
	require.ErrorAs(t, fmt.Errorf("mod: NewThing: %w", err), &oe)
	require.Equal(t, "WithX", oe.Option)

	err = &OptionError{Option: "WithX", Reason: "r"}
	require.NotErrorIs(t, err, module, "no Sentinel: the core's own")
	require.ErrorIs(t, err, ErrInvalidOption)
	require.Equal(t, "keysched: invalid option: WithX: r", err.Error())
}
