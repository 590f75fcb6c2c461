//go:build unix

package keysched

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time (user + system) the process has used: on a
// shared machine, wall time per task swings with what the neighbours run, the
// CPU a task costs much less.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
