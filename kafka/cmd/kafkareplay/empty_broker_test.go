package main

import (
	"strings"
	"testing"
)

// An empty element of --brokers ("$A,$B" with A unset, a doubled comma)
// is a usage error: franz-go takes an empty seed for localhost:9092, so the
// replay would read and write whatever cluster listens there.
func TestAnEmptyBrokerIsRefused(t *testing.T) {
	for _, b := range []string{",127.0.0.1:1", "127.0.0.1:1,,127.0.0.1:2", ",", " "} {
		_, errOut, status := runArgs(t, "--brokers", b, "--dlq", "dlq", "--timeout", "2s")
		if status != exitUsage || !strings.Contains(errOut, "--brokers") {
			t.Errorf("--brokers %q: status %d, stderr %q; want %d naming --brokers", b, status, errOut, exitUsage)
		}
	}
}
