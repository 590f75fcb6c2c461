package inbox_test

import (
	"testing"

	"github.com/keysched/keysched/db/inbox"
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
		{"Inbox", func(t *testing.T) {
			zerotest.Check[inbox.Inbox](t, inbox.ErrZeroInbox, []string{
				"Apply", "Cleanup", "CreateSchema", "Record", "Schema", "Seen",
			})
		}},
		{"Versions", func(t *testing.T) {
			zerotest.Check[inbox.Versions](t, inbox.ErrZeroVersions, []string{
				"Apply", "CreateSchema", "Current", "Gate", "Schema",
			})
		}},
	} {
		t.Run(c.name, c.run)
	}
}
