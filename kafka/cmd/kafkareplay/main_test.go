package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keysched/keysched/kafka"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// With KAFKAREPLAY_RUN_MAIN set, the test binary is the command (for
// TestCommandExitStatus).
func TestMain(m *testing.M) {
	if os.Getenv("KAFKAREPLAY_RUN_MAIN") != "" {
		os.Args = append([]string{"kafkareplay"}, strings.Fields(os.Getenv("KAFKAREPLAY_ARGS"))...)
		main()
	}
	os.Exit(m.Run())
}

// deadLetter is a record as the adapter dead-letters it.
func deadLetter(dlq string, key, value, topic string, part int32, off int64, attempts, replays int, msg string) *kgo.Record {
	hs := []kgo.RecordHeader{{Key: "trace", Value: []byte("t-" + value)}}
	if replays > 0 {
		hs = append(hs,
			kgo.RecordHeader{Key: kafka.HeaderReplayCount, Value: []byte(strconv.Itoa(replays))},
			kgo.RecordHeader{Key: kafka.HeaderReplayDeadLetterTopic, Value: []byte(dlq)},
			kgo.RecordHeader{Key: kafka.HeaderReplayDeadLetterPartition, Value: []byte("0")},
			kgo.RecordHeader{Key: kafka.HeaderReplayDeadLetterOffset, Value: []byte("0")},
			kgo.RecordHeader{Key: kafka.HeaderReplayOriginOffset, Value: []byte(strconv.FormatInt(off, 10))})
	}
	hs = append(hs,
		kgo.RecordHeader{Key: kafka.HeaderTopic, Value: []byte(topic)},
		kgo.RecordHeader{Key: kafka.HeaderPartition, Value: []byte(strconv.Itoa(int(part)))},
		kgo.RecordHeader{Key: kafka.HeaderOffset, Value: []byte(strconv.FormatInt(off, 10))},
		kgo.RecordHeader{Key: kafka.HeaderTimestamp, Value: []byte("1764590000000")},
		kgo.RecordHeader{Key: kafka.HeaderConsumerGroup, Value: []byte("billing")},
		kgo.RecordHeader{Key: kafka.HeaderAttempts, Value: []byte(strconv.Itoa(attempts))},
		kgo.RecordHeader{Key: kafka.HeaderExceptionClass, Value: []byte("*errors.errorString")},
		kgo.RecordHeader{Key: kafka.HeaderMessage, Value: []byte(msg)},
	)
	return &kgo.Record{Topic: dlq, Key: []byte(key), Value: []byte(value), Headers: hs}
}

// cluster starts a kfake cluster with topics t (2 partitions), dlq (good
// dead letters), junk (one record that is not a dead letter), over (a record
// replayed 3 times).
func cluster(t *testing.T) []string {
	t.Helper()
	_, addrs := clusterWith(t)
	return addrs
}

func clusterWith(t *testing.T) (*kfake.Cluster, []string) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "dlq", "junk", "over"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	addrs := c.ListenAddrs()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("dlq"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	ct := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = "t", 2, 1
	ct.Topics = append(ct.Topics, rt)
	if _, err := ct.RequestWith(ctx, cl); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx,
		deadLetter("dlq", "a", "a1", "t", 0, 10, 5, 0, "timeout calling billing"),
		deadLetter("dlq", "b", "b1", "t", 1, 11, 2, 0, "boom"),
		deadLetter("dlq", "a", "a2", "t", 0, 12, 5, 1, "timeout\ncalling billing"),
		deadLetter("junk", "a", "a1", "t", 0, 10, 5, 0, "x"),
		&kgo.Record{Topic: "junk", Key: []byte("z"), Value: []byte("not a dead letter")},
		deadLetter("over", "a", "a1", "t", 0, 10, 5, 3, "x"),
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return c, addrs
}

// records reads topic t.
func records(t *testing.T, addrs []string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics("t"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	for ctx.Err() == nil {
		out = append(out, cl.PollFetches(ctx).Records()...)
	}
	if len(out) != want {
		t.Errorf("topic t has %d records, want %d", len(out), want)
	}
	return out
}

func runArgs(t *testing.T, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, &out, &errOut)
	status = report(err, &errOut)
	return out.String(), errOut.String(), status
}

func TestDryRunListsAndWritesNothing(t *testing.T) {
	addrs := cluster(t)
	out, errOut, status := runArgs(t, "--brokers", strings.Join(addrs, ","), "--dlq", "dlq", "--dry-run")
	if status != exitOK {
		t.Fatalf("status %d: %s", status, errOut)
	}
	want := []string{
		`would replay t/0@10 key="a" attempts=5 replays=0 error="timeout calling billing" from=dlq/0@0 failed=`,
		`would replay t/0@12 key="a" attempts=5 replays=1 error="timeout\ncalling billing" from=dlq/0@2 failed=`,
		`would replay t/1@11 key="b" attempts=2 replays=0 error="boom" from=dlq/0@1 failed=`,
		`would replay 3 records, wrote none (read 3 dead letters, 0 duplicates left out, 0 refused)`,
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("output:\n%s", out)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d:\n%s\nwant\n%s...", i, lines[i], w)
		}
	}
	records(t, addrs, 0)
}

func TestReplayWritesAndReportsEachRecord(t *testing.T) {
	addrs := cluster(t)
	out, errOut, status := runArgs(t, "--brokers", strings.Join(addrs, ","), "--dlq", "dlq", "--error", "timeout",
		"--key", "a", "--topic", "t", "--partition", "0", "--offsets", "0-2", "--since", "2025-12-01T00:00:00Z", "--until", "1h")
	if status != exitOK {
		t.Fatalf("status %d: %s", status, errOut)
	}
	want := "wrote t/0@0 key=\"a\" replay=1 from=dlq/0@0 (failed as t/0@10)\n" +
		"wrote t/0@1 key=\"a\" replay=2 from=dlq/0@2 (failed as t/0@12)\n" +
		"replayed 2 of 2 records (read 3 dead letters, 0 duplicates left out, 0 refused)\n"
	if out != want {
		t.Errorf("output:\n%s\nwant\n%s", out, want)
	}
	for i, r := range records(t, addrs, 2) {
		if string(r.Value) != []string{"a1", "a2"}[i] || r.Headers[0].Key != "trace" {
			t.Errorf("record %d: %s %v", i, r.Value, r.Headers)
		}
	}
}

// A produce that fails for one partition: the output says which records
// were written and which not, and the status is 1.
func TestPartialWriteIsReported(t *testing.T) {
	c, addrs := clusterWith(t)
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "t", Partitions: []int32{1}, Err: kerr.InvalidRecord, Count: -1})
	out, errOut, status := runArgs(t, "--brokers", strings.Join(addrs, ","), "--dlq", "dlq")
	if status != exitFailed || !strings.Contains(errOut, "2 of 3 records written") {
		t.Errorf("status %d, stderr %q", status, errOut)
	}
	for _, want := range []string{
		"wrote t/0@0 key=\"a\" replay=1 from=dlq/0@0 (failed as t/0@10)\n",
		"wrote t/0@1 key=\"a\" replay=2 from=dlq/0@2 (failed as t/0@12)\n",
		"NOT written t/1@11 key=\"b\" from=dlq/0@1: INVALID_RECORD",
		"replayed 2 of 3 records ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestBadInputIsRefusedWithAStatus(t *testing.T) {
	addrs := cluster(t)
	b := strings.Join(addrs, ",")
	for _, c := range []struct {
		name   string
		args   []string
		status int
		msg    string
	}{
		{"no brokers", []string{"--dlq", "dlq"}, exitUsage, "missing flags: --brokers"},
		{"no dead-letter topic", []string{"--brokers", b}, exitUsage, "missing flags: --dlq"},
		{"bad offsets", []string{"--brokers", b, "--dlq", "dlq", "--offsets", "9-3"}, exitUsage, `--offsets "9-3": FROM 9 is above TO 3`},
		{"bad since", []string{"--brokers", b, "--dlq", "dlq", "--since", "yesterday"}, exitUsage, `--since "yesterday"`},
		{"empty time range", []string{"--brokers", b, "--dlq", "dlq", "--since", "1h", "--until", "2h"}, exitUsage, "empty time range"},
		{"bad time", []string{"--brokers", b, "--dlq", "dlq", "--time", "now"}, exitUsage, "--time"},
		{"bad limit", []string{"--brokers", b, "--dlq", "dlq", "--max-replays", "0"}, exitUsage, "--max-replays 0"},
		{"bad partition", []string{"--brokers", b, "--dlq", "dlq", "--partition", "x"}, exitUsage, "--partition"},
		{"unknown topic", []string{"--brokers", b, "--dlq", "nope"}, exitRefused, `dead-letter topic "nope"`},
		{"not a dead letter", []string{"--brokers", b, "--dlq", "junk"}, exitRefused, "junk/0@1: kafka: not one of the adapter's dead letters"},
		{"past the limit", []string{"--brokers", b, "--dlq", "over"}, exitRefused, "over/0@0: kafka: replay limit reached"},
		{"nothing matches", []string{"--brokers", b, "--dlq", "dlq", "--key", "zzz"}, exitRefused, "none selected by the filters"},
		{"unreachable", []string{"--brokers", "127.0.0.1:1", "--dlq", "dlq", "--timeout", "2s"}, exitFailed, "127.0.0.1:1"},
		// Found by attacking the code: --topic "" (a script's unset
		// variable) parsed as no topic filter and replayed every
		// topic's dead letters; so did the other filters given empty.
		{"empty topic", []string{"--brokers", b, "--dlq", "dlq", "--topic", ""}, exitUsage, "--topic given an empty value"},
		{"empty partition", []string{"--brokers", b, "--dlq", "dlq", "--partition="}, exitUsage, "--partition given an empty value"},
		{"empty dead-letter partition", []string{"--brokers", b, "--dlq", "dlq", "--dlq-partition", ""}, exitUsage, "--dlq-partition given"},
		{"empty since", []string{"--brokers", b, "--dlq", "dlq", "--since", ""}, exitUsage, "--since given"},
		{"empty error", []string{"--brokers", b, "--dlq", "dlq", "--error="}, exitUsage, "--error given"},
	} {
		_, errOut, status := runArgs(t, c.args...)
		if status != c.status || !strings.Contains(errOut, c.msg) {
			t.Errorf("%s: status %d, stderr %q; want %d and %q", c.name, status, errOut, c.status, c.msg)
		}
	}
	records(t, addrs, 0)
}

func TestParseOffsets(t *testing.T) {
	for s, want := range map[string][2]int64{"": {0, 0}, "17-42": {17, 43}, "17-": {17, 0}, "-42": {0, 43}, "5": {5, 6}, "0-0": {0, 1}} {
		start, end, err := parseOffsets(s)
		if err != nil || start != want[0] || end != want[1] {
			t.Errorf("%q: %d, %d, %v; want %v", s, start, end, err, want)
		}
	}
	for _, s := range []string{"-", "x", "3-1", "-1-2", "1-x", "9223372036854775807"} {
		if _, _, err := parseOffsets(s); err == nil {
			t.Errorf("%q: no error", s)
		}
	}
}

// The command itself (this test binary re-run as kafkareplay): its exit
// status and its output.
func TestCommandExitStatus(t *testing.T) {
	addrs := cluster(t)
	b := strings.Join(addrs, ",")
	for _, c := range []struct {
		args   string
		status int
		out    string
	}{
		{"--brokers " + b + " --dlq dlq --dry-run", exitOK, "would replay 3 records, wrote none"},
		{"--brokers " + b + " --dlq dlq --key b", exitOK, "wrote t/1@0 key=\"b\" replay=1 from=dlq/0@1 (failed as t/1@11)"},
		{"--brokers " + b + " --dlq junk", exitRefused, "refused: nothing written: 1 selected dead letter cannot be replayed:\n  junk/0@1: "},
		{"--brokers " + b + " --dlq dlq --offsets x", exitUsage, "usage: --offsets"},
		{"--help", exitOK, "Usage: kafkareplay"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "KAFKAREPLAY_RUN_MAIN=1", "KAFKAREPLAY_ARGS="+c.args)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		status := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			status = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if status != c.status || !strings.Contains(out.String(), c.out) {
			t.Errorf("kafkareplay %s: status %d, output:\n%s\nwant %d and %q", c.args, status, out.String(), c.status, c.out)
		}
	}
}

// Found by attacking the code: the original topic is a header any producer
// of the dead-letter topic writes; one holding a newline and a terminal
// escape ("t\n\x1b[32mwrote t/0@0 ...") was printed raw in the refusal and
// the "would replay" lines, forging output lines in the operator's terminal.
// It is printed quoted.
func TestOutputQuotesTheHeadersTopic(t *testing.T) {
	c, addrs := clusterWith(t)
	if err := c.CreateTopic("forged", 1, nil); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	evil := "t\n\x1b[32mwrote t/0@0 key=\"a\" replay=1 from=dlq/0@0 (failed as t/0@10)\x1b[0m"
	if err := cl.ProduceSync(context.Background(), deadLetter("forged", "a", "a1", evil, 0, 10, 5, 0, "x")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	out, errOut, status := runArgs(t, "--brokers", addrs[0], "--dlq", "forged")
	if status != exitRefused {
		t.Fatalf("status %d, want %d: %s", status, exitRefused, errOut)
	}
	for _, s := range []string{out, errOut} {
		if strings.ContainsAny(s, "\x1b") || strings.Contains(s, "\nwrote") || strings.HasPrefix(s, "wrote") {
			t.Errorf("raw header text in the output:\n%q", s)
		}
	}
	if !strings.Contains(out, strconv.Quote(evil)) {
		t.Errorf("the topic is not shown quoted:\n%q", out)
	}
	records(t, addrs, 0)
}
