package kafka

import (
	"testing"

	"github.com/keysched/keysched/internal/zerotest"
)

// TestZeroValues calls every exported method of a nil and a zero handle (not
// made by its constructor): each error result is ErrZeroConsumer, each other
// result the zero value, and nothing panics or hangs. A method added to the
// type and not to its list here fails the test.
func TestZeroValues(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"Consumer", func(t *testing.T) {
			zerotest.Check[Consumer](t, ErrZeroConsumer, []string{
				"Client", "Close", "Group", "Parked", "Resume", "Run", "Skip", "Stats",
			})
		}},
	} {
		t.Run(c.name, c.run)
	}
}
