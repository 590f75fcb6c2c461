package kafka

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// crashEnv tells the test binary it runs as TestCrashLosesNothing's child:
// "<broker address>;<group>".
const crashEnv = "KEYSCHED_KAFKA_CRASH_CHILD"

const (
	crashParts   = 2
	crashKeys    = 5   // per partition
	crashPerPart = 600 // records per partition
	crashTail    = 550 // the child never finishes offsets from here on
)

// TestCrashChild is the member that crashes: it runs only as a child process
// of TestCrashLosesNothing (which SIGKILLs it), consuming from the parent's
// in-process cluster over loopback. For every record it has handled it
// writes "partition offset\n" to file descriptor 3 before the handler
// returns (one write, so a line is whole or absent).
func TestCrashChild(t *testing.T) {
	spec := os.Getenv(crashEnv)
	if spec == "" {
		t.Skip("runs only as the child process of TestCrashLosesNothing")
	}
	addr, rest, _ := strings.Cut(spec, ";")
	group, proto, _ := strings.Cut(rest, ";")
	out := os.NewFile(3, "handled")
	h := func(ctx context.Context, r *kgo.Record) error {
		if r.Offset >= crashTail {
			<-ctx.Done() // the stream never ends here: the kill comes mid-stream
			return ctx.Err()
		}
		t := time.NewTimer(2 * time.Millisecond) // the work
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		if _, err := out.Write(fmt.Appendf(nil, "%d %d\n", r.Partition, r.Offset)); err != nil {
			return err
		}
		return nil
	}
	tc := &testCluster{addrs: []string{addr}}
	opts := tc.clientOptsFor(groupProtocol(proto), group, "t")
	opts = append(opts, kgo.SessionTimeout(time.Second)) // the parent's member waits this long for the dead one
	c, err := NewConsumer(h, WithLogger(quiet), WithCommitInterval(10*time.Millisecond), WithClientOptions(opts...))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Run(context.Background()) // until SIGKILL
}

// Property 6: a member that dies without committing (SIGKILL, mid-stream,
// after it committed at least once) loses nothing: the next owner resumes
// from its last commit, every record is handled at least once, and no record
// of a key is handled for the first time before an earlier one of that key
// was finished (by the dead member or the new one).
func TestCrashLosesNothing(t *testing.T) {
	for _, proto := range groupProtocols {
		t.Run(string(proto), func(t *testing.T) { testCrashLosesNothing(t, proto) })
	}
}

func testCrashLosesNothing(t *testing.T, proto groupProtocol) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" || runtime.GOOS == "js" || runtime.GOOS == "wasip1" {
		t.Skip("needs a child process with an inherited pipe")
	}
	tc := newCluster(t, crashParts, "t")
	commits := tc.watchCommits(t)
	group := groupName(t)
	type kseq struct {
		key string
		seq int
	}
	var rs []*kgo.Record
	for part := range int32(crashParts) {
		for i := range crashPerPart {
			rs = append(rs, rec("t", part, fmt.Sprintf("k%d", i%crashKeys), strconv.Itoa(i/crashKeys)))
		}
	}
	where := map[[2]int64]kseq{} // (partition, offset) -> (key, seq within key)
	for _, p := range tc.produce(t, rs...) {
		where[[2]int64{int64(p.Partition), p.Offset}] = kseq{fmt.Sprintf("%d/%s", p.Partition, p.Key), int(p.Offset) / crashKeys}
	}

	// The tracker: first handlings in order per key, across both members.
	var mu sync.Mutex
	finished := map[[2]int64]bool{}
	var bad []string
	byChild := 0
	first := func(part int32, off int64) {
		// mu held: the record (part, off) is being handled.
		if finished[[2]int64{int64(part), off}] {
			return
		}
		ks := where[[2]int64{int64(part), off}]
		for e := range ks.seq {
			if !finished[[2]int64{int64(part), int64(e*crashKeys) + off%crashKeys}] {
				bad = append(bad, fmt.Sprintf("%s: record %d (offset %d) handled first before record %d finished", ks.key, ks.seq, off, e))
				break
			}
		}
	}

	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnv+"="+tc.addrs[0]+";"+group+";"+string(proto))
	cmd.ExtraFiles = []*os.File{pw}
	var childOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &childOut, &childOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var part int32
			var off int64
			if _, err := fmt.Sscan(sc.Text(), &part, &off); err != nil {
				continue
			}
			mu.Lock()
			first(part, off)
			finished[[2]int64{int64(part), off}] = true
			byChild++
			mu.Unlock()
		}
		pr.Close()
	}()

	eventually(t, "the child committed past offset 0 and handled 100 records", func() bool {
		mu.Lock()
		n := byChild
		mu.Unlock()
		for p := range int32(crashParts) {
			if cs := commits.of("t", p); len(cs) > 0 && cs[len(cs)-1].Offset > 0 && n >= 100 {
				return true
			}
		}
		return false
	})
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no revoke, no final commit
		t.Fatal(err)
	}
	killed = true
	_ = cmd.Wait()
	<-readDone
	if strings.Contains(childOut.String(), "FAIL") || strings.Contains(childOut.String(), "panic") {
		t.Fatalf("the child failed before the kill:\n%s", childOut.String())
	}
	mu.Lock()
	atKill := byChild
	mu.Unlock()
	if atKill >= crashParts*crashTail {
		t.Fatalf("the child handled all %d records before the kill: not mid-stream", atKill)
	}

	firstOff := map[int32]int64{} // the lowest offset the next owner handled, per partition
	var handledByB int
	b := runMember(t, func(ctx context.Context, r *kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		if f, ok := firstOff[r.Partition]; !ok || r.Offset < f {
			firstOff[r.Partition] = r.Offset // the lowest it handled
		}
		first(r.Partition, r.Offset)
		finished[[2]int64{int64(r.Partition), r.Offset}] = true
		handledByB++
		return nil
	}, WithLogger(quiet), WithCommitInterval(10*time.Millisecond), WithClientOptions(tc.clientOptsFor(proto, group, "t")...))
	eventually(t, "every produced record handled by the child or the next owner", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(finished) == len(rs)
	})
	member, _ := b.c.Client().GroupMetadata()
	b.close(t)

	mu.Lock()
	defer mu.Unlock()
	for _, s := range bad {
		t.Error(s)
	}
	for p := range int32(crashParts) {
		last := int64(0)
		for _, c := range commits.of("t", p) {
			if c.Member != member {
				last = c.Offset // the child's commits, in the order the broker took them
			}
		}
		if f, ok := firstOff[p]; !ok || f != last {
			t.Errorf("partition %d: the lowest offset the next owner handled is %d (handled: %v), want the dead member's last commit %d", p, f, ok, last)
		}
	}
	t.Logf("child handled %d records before SIGKILL; the next owner handled %d (%d again)",
		atKill, handledByB, atKill+handledByB-len(rs))
}
