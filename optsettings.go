package keysched

import (
	"errors"

	"github.com/keysched/keysched/internal/schedopt"
)

func init() {
	schedopt.Settings = func(o any) []string {
		opt, ok := o.(Option)
		if !ok || opt == nil {
			return nil
		}
		return opt.settings()
	}
}

// settings names the settings among those schedopt.Settings lists that o
// makes, applying it to a config whose fields say whether it set them. An
// option that refuses its value names the setting it would make (its
// *OptionError names it), so that an adapter that sets it itself says so
// first rather than after the value is mended.
func (o Option) settings() []string {
	c := config{failure: FailurePolicy(-1)}
	if err := o(&c); err != nil {
		var oe *OptionError
		if errors.As(err, &oe) {
			switch oe.Option {
			case "WithDeadLetter", "WithFailurePolicy", "WithMaxPending", "WithMaxKeyDepth", "WithRetryPanics", "WithObserver":
				return []string{oe.Option}
			}
		}
		return nil
	}
	var names []string
	add := func(set bool, name string) {
		if set {
			names = append(names, name)
		}
	}
	add(c.deadLetter != nil, "WithDeadLetter")
	add(c.failure != FailurePolicy(-1), "WithFailurePolicy")
	add(c.pendingSet, "WithMaxPending")
	add(c.depthSet, "WithMaxKeyDepth")
	add(c.retryPanics, "WithRetryPanics")
	add(c.observer != nil, "WithObserver")
	return names
}
