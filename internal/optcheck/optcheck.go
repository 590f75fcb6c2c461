// Package optcheck holds the checks of option values that keysched's
// packages share: the core (keysched), the bus, and the other modules of the
// workspace (kafka, db/outbox, db/inbox, otelkeysched). Go lets those import
// it although they are other modules, because their import paths are below
// github.com/keysched/keysched: it is the modules' shared contract,
// versioned with the core. A module needs a core at least as new as the one
// its go.mod requires, and may be built with a newer one, so keep it like an
// API: add checks, never change or remove one (docs/releasing.md).
//
// A check returns nil for a value it accepts, or a *Refusal that names the
// option, shows the value and says why. The caller turns a Refusal into its
// *keysched.OptionError: the core directly, the other packages with
// package opterror, so that one errors.As(err, &oe) finds a refused option
// whichever package refused it, and its text reads alike everywhere:
// "module: invalid option: Option(Value): Reason".
//
// The options themselves, and how options meet (keysched.Option's rule:
// later wins, nested bounds clamp, defaults yield, options that set one
// thing two ways are refused), stay with each package: only the checks of a
// value on its own, and the wording of a refusal, are here.
package optcheck

import (
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"

	"github.com/panjf2000/ants/v2"
)

// A Refusal says why an option's value is refused. Its fields are those of
// keysched.OptionError, which it becomes.
type Refusal struct {
	// Option names the option as the caller writes it, without its
	// arguments ("WithWorkers"), or "opts[i]" for a nil one.
	Option string
	// Value is the refused argument as shown in the error (strings
	// quoted), or "" where Reason says it.
	Value string
	// With names the other option of two that cannot both hold, or "".
	With string
	// Reason says what is wrong.
	Reason string
}

// Refuse is a Refusal of option's argument value (nil: none shown; shown
// with fmt's %v, so pass a string quoted if it is the argument itself) for
// the reason format and args say: for a check of a package's own.
func Refuse(option string, value any, format string, args ...any) *Refusal {
	r := &Refusal{Option: option, Reason: fmt.Sprintf(format, args...)}
	if value != nil {
		r.Value = fmt.Sprint(value)
	}
	return r
}

// Conflict is the Refusal of option given with (or without) the option with,
// for the reason format and args say.
func Conflict(option, with string, format string, args ...any) *Refusal {
	return &Refusal{Option: option, With: with, Reason: fmt.Sprintf(format, args...)}
}

// WorkersWithPool is the Refusal of a pool size (the option workers) given
// with a caller's pool (the option pool): both set the pool, whose size is
// the caller's.
func WorkersWithPool(workers, pool string) *Refusal {
	return Conflict(workers, pool, "given with %s: both set the pool, whose size is the caller's", pool)
}

// NilOption is the Refusal of the i-th option, nil, of a list of options of
// type kind ("Option", "RelayOption"...): named "opts[i]".
func NilOption(i int, kind string) *Refusal {
	return &Refusal{Option: "opts[" + strconv.Itoa(i) + "]", Reason: "nil " + kind}
}

// MaxWorkers is the largest pool size: ants sizes its pools with an int32.
const MaxWorkers = math.MaxInt32

// Workers checks a pool size: 1 to MaxWorkers.
func Workers(option string, n int) *Refusal {
	if n < 1 || n > MaxWorkers {
		return Refuse(option, n, "need 1 to %d workers (ants sizes pools with an int32)", MaxWorkers)
	}
	return nil
}

// Pool checks a caller's pool: not nil, not released.
func Pool(option string, p *ants.Pool) *Refusal {
	if p == nil {
		return Refuse(option, "nil", "need a pool")
	}
	if p.IsClosed() {
		return Refuse(option, nil, "the pool is already released")
	}
	return nil
}

// Logger checks a logger: not nil (silence one with a discarding handler).
func Logger(option string, l *slog.Logger) *Refusal {
	if l == nil {
		return Refuse(option, "nil", "use slog.New(slog.DiscardHandler) to discard")
	}
	return nil
}

// NotNil checks that a function (or other value) the option needs is given:
// isNil is the caller's test of it, what says what it is ("a function").
func NotNil(option string, isNil bool, what string) *Refusal {
	if isNil {
		return Refuse(option, "nil", "need %s", what)
	}
	return nil
}

// AtLeast checks a count or size: n >= least.
func AtLeast(option string, n, least int) *Refusal {
	if n < least {
		return Refuse(option, n, "need at least %d", least)
	}
	return nil
}

// Positive checks a duration: d > 0.
func Positive(option string, d time.Duration) *Refusal {
	if d <= 0 {
		return Refuse(option, d, "need > 0")
	}
	return nil
}

// NotNegative checks a duration: d >= 0.
func NotNegative(option string, d time.Duration) *Refusal {
	if d < 0 {
		return Refuse(option, d, "need >= 0")
	}
	return nil
}

// Within checks a duration: lo <= d <= hi.
func Within(option string, d, lo, hi time.Duration) *Refusal {
	if d < lo || d > hi {
		return Refuse(option, d, "need %v to %v", lo, hi)
	}
	return nil
}

// Text checks a name: not empty and, for maxLen > 0, at most maxLen bytes.
func Text(option, s string, maxLen int) *Refusal {
	switch {
	case s == "":
		return Refuse(option, strconv.Quote(s), "need a non-empty name")
	case maxLen > 0 && len(s) > maxLen:
		return Refuse(option, strconv.Quote(s), "need at most %d bytes, not %d", maxLen, len(s))
	}
	return nil
}

// OneOf checks an enumerated value: one of known; what names the kind
// ("policy", "ordering") for the refusal. The value is shown as a number.
func OneOf[T ~int](option string, v T, what string, known ...T) *Refusal {
	for _, k := range known {
		if v == k {
			return nil
		}
	}
	return Refuse(option, int(v), "unknown %s", what)
}
