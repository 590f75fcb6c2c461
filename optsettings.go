package keysched

import "github.com/keysched/keysched/internal/schedopt"

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
// makes, applying it to a config whose fields say whether it set them.
func (o Option) settings() []string {
	c := config{failure: FailurePolicy(-1)}
	if o(&c) != nil {
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
