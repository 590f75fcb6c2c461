package durations

import (
	"math"
	"math/big"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// sat clamps an exact result to [lo, hi].
func sat(x *big.Int, lo, hi int64) time.Duration {
	if x.Cmp(big.NewInt(hi)) > 0 {
		return time.Duration(hi)
	}
	if x.Cmp(big.NewInt(lo)) < 0 {
		return time.Duration(lo)
	}
	return time.Duration(x.Int64())
}

func anyDuration() *rapid.Generator[time.Duration] {
	return rapid.OneOf(
		rapid.Map(rapid.Int64(), func(v int64) time.Duration { return time.Duration(v) }),
		rapid.SampledFrom([]time.Duration{0, 1, -1, Max, Max - 1, math.MinInt64, math.MinInt64 + 1, Max / 2, Max/2 + 1}),
	)
}

func anyFloat() *rapid.Generator[float64] {
	return rapid.OneOf(
		rapid.Float64(),
		rapid.SampledFrom([]float64{0, math.Copysign(0, -1), 1, -1, math.NaN(), math.Inf(1), math.Inf(-1),
			math.MaxInt64, math.Nextafter(math.MaxInt64, 0), math.MaxFloat64, math.SmallestNonzeroFloat64, 1e19, 0.5}),
	)
}

func TestMulSaturates(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d := anyDuration().Draw(t, "d")
		n := rapid.OneOf(rapid.Int64(), rapid.SampledFrom([]int64{0, 1, 2, -1, math.MaxInt64})).Draw(t, "n")
		got := Mul(d, n)
		want := time.Duration(0)
		if d > 0 && n > 0 {
			want = sat(new(big.Int).Mul(big.NewInt(int64(d)), big.NewInt(n)), 0, math.MaxInt64)
		}
		if got != want {
			t.Fatalf("Mul(%d, %d) = %d, want %d", d, n, got, want)
		}
	})
}

func TestAddSaturates(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := anyDuration().Draw(t, "a"), anyDuration().Draw(t, "b")
		want := sat(new(big.Int).Add(big.NewInt(int64(a)), big.NewInt(int64(b))), math.MinInt64, math.MaxInt64)
		if got := Add(a, b); got != want {
			t.Fatalf("Add(%d, %d) = %d, want %d", a, b, got, want)
		}
	})
}

func TestFromFloatScalePerSecondNeverNegative(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := anyFloat().Draw(t, "f")
		d := anyDuration().Draw(t, "d")
		for name, got := range map[string]time.Duration{
			"FromFloat": FromFloat(f), "Scale": Scale(d, f), "PerSecond": PerSecond(f),
		} {
			if got < 0 {
				t.Fatalf("%s(%v, %v) = %d < 0", name, d, f, got)
			}
		}
		// Exact where the value is in range, saturated beyond.
		switch {
		case math.IsNaN(f) || f <= 0:
			if FromFloat(f) != 0 {
				t.Fatalf("FromFloat(%v) = %d, want 0", f, FromFloat(f))
			}
		case f >= math.MaxInt64:
			if FromFloat(f) != Max {
				t.Fatalf("FromFloat(%v) = %d, want Max", f, FromFloat(f))
			}
		default:
			if FromFloat(f) != time.Duration(f) {
				t.Fatalf("FromFloat(%v) = %d, want %d", f, FromFloat(f), time.Duration(f))
			}
		}
		// Monotone in f.
		g := anyFloat().Draw(t, "g")
		if !math.IsNaN(f) && !math.IsNaN(g) && f <= g && FromFloat(f) > FromFloat(g) {
			t.Fatalf("FromFloat not monotone: %v -> %d, %v -> %d", f, FromFloat(f), g, FromFloat(g))
		}
	})
}

func TestExamples(t *testing.T) {
	// The input of issue 8: 2^63 ns as a float, which time.Duration(f)
	// turns into math.MinInt64 on amd64.
	if got := FromFloat(float64(math.MaxInt64)); got != Max {
		t.Fatalf("FromFloat(2^63) = %d", got)
	}
	if got := Scale(time.Nanosecond, 1e19); got != Max {
		t.Fatalf("Scale(1ns, 1e19) = %d", got)
	}
	if got := PerSecond(1e-300); got != Max {
		t.Fatalf("PerSecond(1e-300) = %d", got)
	}
	if got := PerSecond(1000); got != time.Millisecond {
		t.Fatalf("PerSecond(1000) = %v", got)
	}
	if got := Clamp(5, 1, 3); got != 3 {
		t.Fatalf("Clamp = %v", got)
	}
}
