//go:build race

package main

// raceEnabled makes the crash test build the service with -race too, so the
// binary reuses the race-instrumented packages the test build compiled.
const raceEnabled = true
