package bus

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/opttest"
	"github.com/panjf2000/ants/v2"
	"github.com/stretchr/testify/require"
)

// A refused option is a *keysched.OptionError named as the caller wrote it:
// the SubOption (MaxKeyDepth), not the scheduler option it became
// (keysched.WithMaxKeyDepth), although keysched.New is what checks it.
func TestOptionErrorNamesTheBusOption(t *testing.T) {
	b := newBus[string](t)
	h := func(context.Context, Envelope[string], int) error { return nil }
	for _, tc := range []struct {
		opts         []SubOption
		option, with string
	}{
		{[]SubOption{MaxConcurrency(0)}, "MaxConcurrency", ""},
		{[]SubOption{MaxKeyDepth(0)}, "MaxKeyDepth", ""},
		{[]SubOption{MaxPending(-1)}, "MaxPending", ""},
		{[]SubOption{Retry(keysched.RetryPolicy{MaxAttempts: -1})}, "Retry", ""},
		{[]SubOption{Failure(7)}, "Failure", ""},
		{[]SubOption{Timeout(0)}, "Timeout", ""},
		{[]SubOption{Observe(keysched.Observer[int]{})}, "Observe", ""},
		{[]SubOption{OnFull(9)}, "OnFull", ""},
		{[]SubOption{EjectAfter(0), Timeout(1)}, "EjectAfter", ""},
		{[]SubOption{EjectAfter(1)}, "EjectAfter", "Timeout"},
		{[]SubOption{DeadLetters[string](nil)}, "DeadLetters", ""},
		{[]SubOption{DeadLetters(func(DeadLetter[int]) {})}, "DeadLetters", ""},
		{[]SubOption{MaxPending(1), nil}, "opts[1]", ""},
	} {
		_, err := Subscribe(b, "s", h, tc.opts...)
		require.ErrorIs(t, err, keysched.ErrInvalidOption, tc.option)
		var oe *keysched.OptionError
		require.ErrorAs(t, err, &oe, tc.option)
		require.Equal(t, tc.option, oe.Option, err.Error())
		require.Equal(t, tc.with, oe.With, err.Error())
	}
	p, err := ants.NewPool(2)
	require.NoError(t, err)
	defer p.Release()
	_, err = New[string](WithWorkers(2), WithPool(p))
	var oe *keysched.OptionError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, [2]string{"WithWorkers", "WithPool"}, [2]string{oe.Option, oe.With}, err.Error())
}

// SubOptions meet by keysched.Option's rule: of MaxKeyDepth and MaxPending
// given, MaxPending applies first; MaxKeyDepth alone raises the default
// pending bound to it (the bus passes the scheduler only what the caller
// gave, so the default can give way).
func TestSubOptionsMeetByOneRule(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   []SubOption
		accept int // events of one key accepted before a refusal
		refuse error
	}{
		{"depth above pending: pending applies first", []SubOption{MaxKeyDepth(100), MaxPending(10)}, 10, keysched.ErrFull},
		{"the last MaxPending wins", []SubOption{MaxPending(10), MaxPending(5)}, 5, keysched.ErrFull},
		// 65,541 publishes: about 1 s, 4 s with -race (skipped there; the
		// core's TestOptionsMeetByOneRule holds the rule itself).
		{"depth alone above the default pending raises it", []SubOption{MaxKeyDepth(keysched.DefaultMaxPending + 5)}, keysched.DefaultMaxPending + 5, keysched.ErrFull},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if raceEnabled && tc.accept > 1000 {
				t.Skip("slow under -race")
			}
			b := newBus[string](t)
			release := make(chan struct{})
			h := func(ctx context.Context, _ Envelope[string], _ int) error { <-release; return nil }
			_, err := Subscribe(b, "s", h, append(tc.opts, OnFull(Reject))...)
			require.NoError(t, err)
			defer close(release)
			ctx := context.Background()
			for i := range tc.accept {
				require.NoError(t, b.Publish(ctx, "k", i), "event %d", i)
			}
			err = b.Publish(ctx, "k", tc.accept)
			require.ErrorIs(t, err, tc.refuse)
			other := keysched.ErrKeyFull
			if errors.Is(tc.refuse, keysched.ErrKeyFull) {
				other = keysched.ErrFull
			}
			require.False(t, errors.Is(err, other), "%v", err)
		})
	}
}

// New refuses its options with the scheduler's checks: each refusal is a
// *keysched.OptionError naming the option, wrapped "bus: ...", and a pool
// size past ants' int32 is refused as keysched.WithWorkers refuses it.
func TestNewRefusesEachBadOptionByName(t *testing.T) {
	released, err := ants.NewPool(1)
	require.NoError(t, err)
	released.Release()
	for _, tc := range []struct {
		opts   []Option
		option string
	}{
		{[]Option{WithWorkers(0)}, "WithWorkers"},
		{[]Option{WithWorkers(math.MaxInt32 + 1)}, "WithWorkers"},
		{[]Option{WithPool(nil)}, "WithPool"},
		{[]Option{WithPool(released)}, "WithPool"},
		{[]Option{WithLogger(nil)}, "WithLogger"},
		{[]Option{WithWorkers(1), nil}, "opts[1]"},
	} {
		b, err := New[string](tc.opts...)
		require.Nil(t, b, tc.option)
		require.Empty(t, opttest.Problem(err, opttest.Want{Option: tc.option, Prefix: "bus: keysched: invalid option: "}))
	}
}
