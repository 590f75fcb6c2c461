// Package durations does time.Duration arithmetic that saturates instead of
// wrapping: every result is within [0, Max] (the "never negative" helpers) or
// within the int64 range (Add), and nothing panics, for every input.
//
// Converting a float64 to time.Duration with time.Duration(f) is undefined
// in Go for an f outside the int64 range: on amd64 2^63 ns becomes
// math.MinInt64 (a negative delay, so a timer fires at once), on arm64 it
// saturates. Multiplying two durations, or a duration by a count, wraps
// silently. Code of this module computing backoffs, deadlines, timeouts,
// commit intervals or rates goes through here.
package durations

import (
	"math"
	"time"
)

// Max is the longest time.Duration, about 292 years.
const Max = time.Duration(math.MaxInt64)

// FromFloat converts f nanoseconds to a Duration, saturating: NaN and values
// below zero give 0, values at or above 2^63 (+Inf included) give Max.
func FromFloat(f float64) time.Duration {
	switch {
	case !(f > 0): // NaN, zero, negative
		return 0
	case f >= math.MaxInt64: // float64(MaxInt64) is 2^63: out of range
		return Max
	}
	return time.Duration(f)
}

// Scale returns d times f, saturating to [0, Max] (NaN gives 0). Negative d
// or f give 0.
func Scale(d time.Duration, f float64) time.Duration {
	if d <= 0 {
		return 0
	}
	return FromFloat(float64(d) * f)
}

// Mul returns d times n, saturating to [0, Max]. Negative d or n give 0.
func Mul(d time.Duration, n int64) time.Duration {
	if d <= 0 || n <= 0 {
		return 0
	}
	if d > Max/time.Duration(n) {
		return Max
	}
	return d * time.Duration(n)
}

// Add returns a + b, saturating to [math.MinInt64, Max] instead of wrapping.
func Add(a, b time.Duration) time.Duration {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return Max
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}

// PerSecond returns the interval between events at rate events per second,
// saturating to [0, Max]: 0 for a rate that is not positive or is NaN (no
// pacing), Max for a rate so small that the interval overflows.
func PerSecond(rate float64) time.Duration {
	if !(rate > 0) {
		return 0
	}
	return FromFloat(float64(time.Second) / rate)
}

// Clamp returns d bounded to [lo, hi] (lo <= hi).
func Clamp(d, lo, hi time.Duration) time.Duration {
	return min(max(d, lo), hi)
}
