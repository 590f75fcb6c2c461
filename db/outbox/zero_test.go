package outbox_test

import (
	"testing"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/internal/zerotest"
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
		{"Outbox", func(t *testing.T) {
			zerotest.Check[outbox.Outbox](t, outbox.ErrZeroOutbox, []string{
				"Count", "CreateSchema", "DB", "Dead", "Dialect", "NewRelay",
				"Parked", "Recover", "Recoverable", "Resume", "Schema", "Skip", "SkipHead", "Table", "Write",
			})
		}},
		{"Relay", func(t *testing.T) {
			zerotest.Check[outbox.Relay](t, outbox.ErrZeroRelay, []string{
				"Close", "Owner", "Parked", "Recover", "Resume", "Run", "Scheduler", "Skip", "SkipHead", "Stats", "Token",
			})
		}},
	} {
		t.Run(c.name, c.run)
	}
}
