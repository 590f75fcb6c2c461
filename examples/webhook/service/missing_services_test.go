package service

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The PostgreSQL and browser tests fail when their server or browser is
// missing, naming the variable that opts out (and, for the browser, the
// path that was set); with it set to 1 they skip, and TestMain says so on
// stderr.
// Each case runs this test binary again as a child, with the service
// pointed at a socket directory where no server listens or a browser path
// that does not exist.
func TestMissingServicesFailUnlessSkipped(t *testing.T) {
	if os.Getenv("WEBHOOK_TEST_CHILD") == "1" {
		t.Skip("runs only as the parent of its children")
	}
	noChromium := t.TempDir() + "/no-chromium"
	for _, c := range []struct {
		name, test, skipVar string
		env                 []string
		wantOut             string
	}{
		{"postgres", "TestPostgresParkResumeRestart", envSkipPostgres,
			[]string{envPostgresDSN + "=host=" + t.TempDir() + " dbname=nobody connect_timeout=2"}, "POSTGRESQL NOT AVAILABLE"},
		{"browser", "TestOperatorPageInBrowser", envSkipBrowser,
			[]string{envChromium + "=" + noChromium}, "NO CHROMIUM BINARY: " + envChromium + "=" + noChromium + " is set"},
	} {
		for _, skip := range []string{"", "1"} {
			t.Run(c.name+"/"+c.skipVar+"="+skip, func(t *testing.T) {
				cmd := exec.Command(os.Args[0], "-test.run", "^"+c.test+"$", "-test.v", "-test.count=1")
				cmd.Env = append(append(os.Environ(), "WEBHOOK_TEST_CHILD=1", c.skipVar+"="+skip), c.env...)
				out, err := cmd.CombinedOutput()
				if skip == "1" {
					if err != nil || !strings.Contains(string(out), "--- SKIP: "+c.test) {
						t.Fatalf("opted out: want a skip and success, got %v:\n%s", err, out)
					}
					// The opt-out shows without -v too (TestMain's line).
					if want := "*** " + c.skipVar + "=1: "; !strings.Contains(string(out), want) {
						t.Fatalf("opted out: child output lacks %q:\n%s", want, out)
					}
					return
				}
				if err == nil {
					t.Fatalf("missing and not opted out: the child passed:\n%s", out)
				}
				for _, want := range []string{c.wantOut, c.skipVar + "=1", "--- FAIL: " + c.test} {
					if !strings.Contains(string(out), want) {
						t.Fatalf("child output lacks %q:\n%s", want, out)
					}
				}
			})
		}
	}
}
