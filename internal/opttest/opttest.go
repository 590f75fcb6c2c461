// Package opttest checks, for the tests of keysched's modules, that an error
// is a refused option as every module makes it (see keysched.OptionError):
// the tests of the bus, the Kafka adapter, the outbox, the inbox and
// otelkeysched hold their refusals to one contract through it.
package opttest

import (
	"errors"
	"fmt"
	"strings"

	"github.com/keysched/keysched"
)

// A Want is the refusal a test expects.
type Want struct {
	// Option and With are the names the *keysched.OptionError must carry
	// (With "" for a refusal of one option).
	Option, With string
	// Prefix begins the error's text, before the option's name: the
	// module's ("outbox: invalid option: ", "bus: keysched: invalid
	// option: ").
	Prefix string
	// Sentinels are matched by the error (errors.Is) besides
	// keysched.ErrInvalidOption: the module's own ErrInvalidOption.
	Sentinels []error
}

// Problem returns "" when err is the refusal w describes: errors.As finds a
// *keysched.OptionError naming w.Option and w.With, with a reason; errors.Is
// matches keysched.ErrInvalidOption and every one of w.Sentinels; the text
// begins with w.Prefix and w.Option. Otherwise it says what differs.
func Problem(err error, w Want) string {
	var oe *keysched.OptionError
	if !errors.As(err, &oe) {
		return fmt.Sprintf("%s: %v, want a *keysched.OptionError", w.Option, err)
	}
	var p []string
	if oe.Option != w.Option || oe.With != w.With {
		p = append(p, fmt.Sprintf("names %q with %q, want %q with %q", oe.Option, oe.With, w.Option, w.With))
	}
	if oe.Reason == "" {
		p = append(p, "no reason")
	}
	for _, s := range append([]error{keysched.ErrInvalidOption}, w.Sentinels...) {
		if !errors.Is(err, s) {
			p = append(p, fmt.Sprintf("does not match %q", s))
		}
	}
	if !strings.HasPrefix(err.Error(), w.Prefix+w.Option) {
		p = append(p, fmt.Sprintf("text does not begin %q", w.Prefix+w.Option))
	}
	if p == nil {
		return ""
	}
	return fmt.Sprintf("%s: %q: %s", w.Option, err, strings.Join(p, "; "))
}
