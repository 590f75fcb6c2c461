package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"testing"
)

// TestPGStatsReportsTheRunsCost: --pgstats adds each run's cost on the
// server to its JSON line: WAL bytes and the outbox table's tuples.
func TestPGStatsReportsTheRunsCost(t *testing.T) {
	if testing.Short() {
		t.Skip("a benchmark run")
	}
	dsn := "host=/var/run/postgresql dbname=keysched_test"
	if _, _, err := newEnv(context.Background(), "postgres", dsn); err != nil {
		if os.Getenv("KEYSCHED_SKIP_POSTGRES") == "1" {
			t.Skip("KEYSCHED_SKIP_POSTGRES=1")
		}
		t.Fatalf("PostgreSQL not reachable: %v", err)
	}
	old := statsSettle
	statsSettle = 0 // the tuple counts may lag (an idle backend reports within 10 s): not checked here
	t.Cleanup(func() { statsSettle = old })
	var out bytes.Buffer
	if err := mainErr(context.Background(), []string{"--json", "--db", "postgres", "--dsn", dsn, "--systems", "keysched", "--pgstats",
		"--events", "100", "--keys", "10", "--relays", "1", "--rounds", "1", "--only", "throughput", "--timeout", "60s"}, &out); err != nil {
		t.Fatal(err)
	}
	line, _, _ := bytes.Cut(out.Bytes(), []byte("\n"))
	var row struct {
		Kind string   `json:"kind"`
		PG   *pgDelta `json:"pgstats"`
	}
	if err := json.Unmarshal(line, &row); err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	if row.Kind != "run" || row.PG == nil || row.PG.Events != 100 || row.PG.WALBytes <= 0 {
		t.Fatalf("no pgstats with WAL bytes in %s", line)
	}
	if s := row.PG.String(); !bytes.Contains([]byte(s), []byte("pgstats per event: WAL")) {
		t.Errorf("text form: %q", s)
	}
}
