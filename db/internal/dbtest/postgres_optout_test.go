package dbtest

import "testing"

// With KEYSCHED_SKIP_POSTGRES=1 the test binary says on stderr that the
// package's PostgreSQL tests are skipped (without -v, go test shows no
// SKIP line); without it, it says nothing.
func TestSkippedPostgresIsAnnounced(t *testing.T) { CheckOptOutAnnounced(t) }
