package kafka

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// A lasting fault logs one line per state change, not one per try: the
// first failure, "still failing" after 10 and 100 tries (with the last
// error), the recovery; a second outage starts over.
func TestFaultLogOneLinePerStateChange(t *testing.T) {
	logs := &logBuffer{}
	f := newFaultLog(logs.logger(), "offset commit")
	f.ok() // nothing failing: nothing said
	for i := range 150 {
		f.fail(fmt.Errorf("try %d: %w", i+1, errors.New("COORDINATOR_NOT_AVAILABLE")), "partition", 3)
	}
	f.ok()
	f.ok()
	f.fail(errors.New("again"))
	l := logs.String()
	lines := strings.Split(strings.TrimSpace(l), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines, want 5 (failing, still failing x2, recovered, failing):\n%s", len(lines), l)
	}
	for i, want := range []string{"offset commit failing", "still failing", "still failing", "recovered", "offset commit failing"} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d: %s, want %q", i, lines[i], want)
		}
	}
	if !strings.Contains(lines[1], "tries=10") || !strings.Contains(lines[1], "try 10:") || !strings.Contains(lines[2], "tries=100") ||
		!strings.Contains(lines[3], "failed_tries=150") || !strings.Contains(lines[0], "partition=3") {
		t.Errorf("the lines lack the tries, the last error or the attributes:\n%s", l)
	}
}
