package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Without -db the service keeps its SQLite database in a temporary
// directory: Ctrl-C (SIGINT) or SIGTERM shuts it down cleanly and removes
// that directory. (A SIGKILL cannot be caught: TestCrashDuringDeliveryLosesNothing.)
func TestTempDatabaseRemovedOnSignal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the service binary")
	}
	bin := buildService(t)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp) // the child's os.TempDir
			p := startService(t, bin, "-intake", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-partners", "2", "-sim-rate", "0", "-log", "info")
			dirs, err := filepath.Glob(filepath.Join(tmp, "keysched-webhook-*"))
			require.NoError(t, err)
			require.Len(t, dirs, 1, "the temporary database directory, in %s", tmp)
			require.FileExists(t, filepath.Join(dirs[0], "webhook.db"))

			require.NoError(t, p.cmd.Process.Signal(sig))
			select {
			case <-p.exited:
			case <-time.After(60 * time.Second): // a watchdog: shutdown waits at most 10 s
				_ = p.cmd.Process.Kill()
				t.Fatalf("no exit within 60 s of %v; stderr:\n%s", sig, p.stderr)
			}
			require.Equal(t, 0, p.cmd.ProcessState.ExitCode(), "stderr:\n%s", p.stderr)
			_, err = os.Stat(dirs[0])
			require.True(t, os.IsNotExist(err), "%s still exists after %v (%v); stderr:\n%s", dirs[0], sig, err, p.stderr)
		})
	}
}
