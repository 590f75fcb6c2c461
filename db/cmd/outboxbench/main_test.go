package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestEverySystemDeliversEveryEventOnce is a smoke run: a hundred events
// through each system on each reachable database, healthy and with one key
// failing; the outbox shows no order violation and no duplicate, and the
// --json lines parse.
func TestEverySystemDeliversEveryEventOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("smoke run of the benchmark")
	}
	dbs := "sqlite,postgres"
	if _, _, err := newEnv(context.Background(), "postgres", "host=/var/run/postgresql dbname=keysched_test"); err != nil {
		if os.Getenv("KEYSCHED_SKIP_POSTGRES") != "1" {
			t.Fatalf("PostgreSQL not reachable (set it up as README.md says, or KEYSCHED_SKIP_POSTGRES=1 for SQLite only): %v", err)
		}
		t.Logf("KEYSCHED_SKIP_POSTGRES=1: SQLite only (%v)", err)
		dbs = "sqlite"
	}
	// Every system healthy; then the outbox and Watermill with one key
	// failing (Watermill's forwarder delivers nothing after the failing
	// event: that run lasts its whole --timeout).
	var out bytes.Buffer
	common := []string{"--json", "--db", dbs, "--events", "100", "--keys", "10", "--relays", "1", "--rounds", "1"}
	if err := mainErr(context.Background(), append(common, "--only", "throughput", "--timeout", "60s"), &out); err != nil {
		t.Fatal(err)
	}
	var backlog bytes.Buffer
	if err := mainErr(context.Background(), []string{"--json", "--db", "sqlite", "--systems", "keysched", "--backlog", "--events", "100",
		"--keys", "10", "--relays", "1", "--rounds", "1", "--only", "throughput"}, &backlog); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(backlog.Bytes(), []byte(`"delivered":100,`)) {
		t.Errorf("--backlog: not every event delivered:\n%s", backlog.String())
	}
	// Relays that keep published rows (marked sent by an UPDATE).
	var retained bytes.Buffer
	if err := mainErr(context.Background(), []string{"--json", "--db", "sqlite", "--systems", "keysched", "--retention", "1h", "--events", "100",
		"--keys", "10", "--relays", "1", "--rounds", "1", "--only", "throughput"}, &retained); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(retained.Bytes(), []byte(`"delivered":100,`)) {
		t.Errorf("--retention: not every event delivered:\n%s", retained.String())
	}
	if dbs != "sqlite" {
		// The outbox without its NOTIFY trigger: relays poll only.
		var polled bytes.Buffer
		if err := mainErr(context.Background(), append(common, "--db", "postgres", "--systems", "keysched", "--notify=false",
			"--only", "throughput", "--timeout", "60s"), &polled); err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(polled.Bytes(), []byte(`"delivered":100,`)) {
			t.Errorf("--notify=false: not every event delivered:\n%s", polled.String())
		}
		// Write notifies, no trigger.
		var fromWrite bytes.Buffer
		if err := mainErr(context.Background(), append(common, "--db", "postgres", "--systems", "keysched", "--notify-from-write",
			"--only", "throughput", "--timeout", "60s"), &fromWrite); err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(fromWrite.Bytes(), []byte(`"delivered":100,`)) {
			t.Errorf("--notify-from-write: not every event delivered:\n%s", fromWrite.String())
		}
	}
	if err := mainErr(context.Background(), append(common, "--only", "isolation", "--timeout", "60s", "--systems", "keysched"), &out); err != nil {
		t.Fatal(err)
	}
	if dbs != "sqlite" {
		if err := mainErr(context.Background(), append(common, "--db", "postgres", "--only", "isolation", "--timeout", "1s", "--systems", "watermill"), &out); err != nil {
			t.Fatal(err)
		}
	}
	runs := map[string]int{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var row struct {
			Kind            string  `json:"kind"`
			DB              string  `json:"db"`
			System          string  `json:"system"`
			Scenario        string  `json:"scenario"`
			Delivered       int     `json:"delivered"`
			OrderViolations int64   `json:"order_violations"`
			Duplicates      int64   `json:"duplicates"`
			TimedOut        bool    `json:"timed_out"`
			DeliverRate     float64 `json:"delivered_events_per_s"`
			BadCalls        int64   `json:"failing_key_sink_calls"`
		}
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			t.Fatalf("line %q: %v", sc.Bytes(), err)
		}
		if row.Kind != "run" {
			continue
		}
		runs[row.DB+" "+row.System+" "+row.Scenario]++
		name := row.DB + " " + row.System + " " + row.Scenario
		switch {
		case row.Scenario == "healthy" && (row.TimedOut || row.Delivered != 100 || row.DeliverRate <= 0):
			t.Errorf("%s: %d of 100 delivered, timed out %v", name, row.Delivered, row.TimedOut)
		case row.Scenario != "healthy" && row.BadCalls == 0:
			t.Errorf("%s: the failing key's sink was never called", name)
		case row.System == "keysched outbox" && (row.OrderViolations != 0 || row.Duplicates != 0):
			t.Errorf("%s: %d order violations, %d duplicates", name, row.OrderViolations, row.Duplicates)
		case row.System == "keysched outbox" && row.Scenario != "healthy" && (row.TimedOut || row.Delivered != 90):
			t.Errorf("%s: the other keys' 90 events: %d delivered, timed out %v", name, row.Delivered, row.TimedOut)
		}
	}
	want := []string{"sqlite keysched outbox healthy", "sqlite river healthy", "sqlite keysched outbox one key failing"}
	if dbs != "sqlite" {
		want = append(want, "postgres keysched outbox healthy", "postgres river healthy", "postgres watermill healthy", "postgres watermill one key failing")
	}
	for _, w := range want {
		if runs[w] != 1 {
			t.Errorf("run %q: %d rows, want 1 (all: %v)", w, runs[w], runs)
		}
	}
}

// TestBadFlagsAreRefused: a bad flag is an error, not a run.
func TestBadFlagsAreRefused(t *testing.T) {
	for _, args := range [][]string{{"--systems", "kafka"}, {"--relays", "0"}, {"--keys", "1"}, {"--only", "both"}, {"--retention", "-1s"},
		{"--db", "mysql"}, {"--db", ""}, {"--db", "sqlite,"}, {"--events", "10", "extra"}} {
		if err := mainErr(context.Background(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// A run that can measure nothing (a system with no adapter for the only
// database given; a database that cannot be opened) is an error naming
// why, not an empty table and exit 0; with --json the skip is a line of
// its own too.
func TestNothingMeasuredIsAnError(t *testing.T) {
	for _, args := range [][]string{
		{"--db", "sqlite", "--systems", "watermill", "--events", "20", "--keys", "2", "--rounds", "1", "--relays", "1"},
		{"--db", "postgres", "--dsn", "host=/nonexistent-keysched dbname=x connect_timeout=2", "--events", "20", "--keys", "2", "--rounds", "1", "--relays", "1", "--json"},
	} {
		var out bytes.Buffer
		err := mainErr(context.Background(), args, &out)
		if err == nil || !strings.Contains(err.Error(), "nothing measured") {
			t.Errorf("%v: %v\n%s", args, err, out.String())
		}
		if slices.Contains(args, "--json") && !strings.Contains(out.String(), `"kind":"skipped"`) {
			t.Errorf("%v: no skipped line in %q", args, out.String())
		}
	}
}
