package outbox_test

import (
	"testing"

	"github.com/keysched/keysched/db/internal/dbtest"
)

// With KEYSCHED_SKIP_POSTGRES=1 the test binary says on stderr that the
// package's PostgreSQL tests are skipped (without -v, go test shows no
// SKIP line); without it, it says nothing.
func TestSkippedPostgresIsAnnounced(t *testing.T) { dbtest.CheckOptOutAnnounced(t) }
