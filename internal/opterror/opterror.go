// Package opterror turns a refusal of the shared option checks
// (internal/optcheck) into the *keysched.OptionError of a package other than
// the core: the bus, the Kafka adapter, the outbox and its relay, the inbox,
// otelkeysched. Like optcheck it is the modules' shared contract, versioned
// with the core and kept like an API (Go lets the modules below
// github.com/keysched/keysched import it; see optcheck).
//
// A module whose errors match a sentinel of its own (kafka.ErrInvalidOption,
// outbox.ErrInvalidOption...) gives it: the error then matches both that
// sentinel and keysched.ErrInvalidOption (errors.Is), errors.As finds the
// *keysched.OptionError naming the option, and its text begins with the
// sentinel's ("outbox: invalid option: WithBatchSize(0): need at least 1").
package opterror

import (
	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/optcheck"
)

// New is the *keysched.OptionError of r for the module whose sentinel is
// sentinel (nil for one that matches keysched.ErrInvalidOption only), or
// nil for a nil r, so that a check's result can be returned as it is.
func New(sentinel error, r *optcheck.Refusal) error {
	if r == nil {
		return nil
	}
	return &keysched.OptionError{Option: r.Option, Value: r.Value, With: r.With, Reason: r.Reason, Sentinel: sentinel}
}
