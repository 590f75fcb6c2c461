//go:build !linux

package main

import "time"

// waitIO parks the calling goroutine for d. Off Linux it is time.Sleep, whose
// precision depends on the platform's timers.
func waitIO(d time.Duration) { time.Sleep(d) }
