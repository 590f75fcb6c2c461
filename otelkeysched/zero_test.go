package otelkeysched_test

import (
	"testing"

	"github.com/keysched/keysched/internal/zerotest"
	"github.com/keysched/keysched/otelkeysched"
)

// TestZeroValues calls every exported method of a nil and a zero handle (not
// made by its constructor): each error result is the type's ErrZero...
// sentinel, each other result the zero value, and nothing panics or hangs.
// A method added to a type and not to its list here fails the test.
func TestZeroValues(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"Metrics", func(t *testing.T) {
			zerotest.Check[otelkeysched.Metrics[string]](t, otelkeysched.ErrZeroMetrics, []string{
				"Observer", "Register", "RegisterSubscription", "Unregister",
			})
		}},
		{"Registration", func(t *testing.T) {
			zerotest.Check[otelkeysched.Registration](t, otelkeysched.ErrZeroRegistration, []string{
				"Unregister",
			})
		}},
	} {
		t.Run(c.name, c.run)
	}
}
