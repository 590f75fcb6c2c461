package dbtest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A test that needs PostgreSQL fails when no server answers, naming the
// variable that opts out; with KEYSCHED_SKIP_POSTGRES=1 it skips. Each case
// runs this test binary again as a child, against a socket directory where
// no server listens.
func TestMissingPostgresFailsUnlessSkipped(t *testing.T) {
	if os.Getenv("DBTEST_CHILD") == "1" {
		Postgres(t)
		return
	}
	for _, c := range []struct {
		name, skip string
		wantFail   bool
		wantOut    string
	}{
		{"no opt-out", "", true, "POSTGRESQL NOT AVAILABLE"},
		{"opted out", "1", false, "--- SKIP"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestMissingPostgresFailsUnlessSkipped$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(),
				"DBTEST_CHILD=1",
				EnvDSN+"=host="+t.TempDir()+" dbname=nobody connect_timeout=2",
				EnvSkip+"="+c.skip)
			out, err := cmd.CombinedOutput()
			if failed := err != nil; failed != c.wantFail {
				t.Fatalf("child failed=%v (%v), want %v:\n%s", failed, err, c.wantFail, out)
			}
			if !strings.Contains(string(out), c.wantOut) {
				t.Fatalf("child output lacks %q:\n%s", c.wantOut, out)
			}
			if c.wantFail && !strings.Contains(string(out), EnvSkip+"=1") {
				t.Fatalf("the failure does not name the opt-out %s=1:\n%s", EnvSkip, out)
			}
		})
	}
}
