package outbox_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// pausedChildEnv names the variable that makes the test binary run
// pausedRelayChild (TestPausedRelayProcess's relay process) instead of the
// tests; it holds the DSN, OUTBOX_PAUSE_TABLE the outbox table.
const pausedChildEnv = "OUTBOX_PAUSE_DSN"

// pausedLease is the lease of the relay paused by TestPausedRelayProcess.
const pausedLease = 400 * time.Millisecond

// pausedRelayChild runs one relay (one worker, so that one sink call runs at
// a time) whose sink prints "start key j token epoch" when a call starts and
// "done key j token epoch" when it returns (its claim, from ClaimFrom); its first call prints "inflight" and
// sleeps 300 ms ignoring its context (a broker completing a produce the
// client gave up on). When stdin closes it closes the relay and prints its
// stats.
func pausedRelayChild() {
	out := &syncWriter{w: os.Stdout}
	ctx := context.Background()
	db, err := sqldb.OpenPostgres(ctx, os.Getenv(pausedChildEnv))
	if err != nil {
		panic(err)
	}
	ob, err := outbox.New(db, outbox.WithTable(os.Getenv("OUTBOX_PAUSE_TABLE")))
	if err != nil {
		panic(err)
	}
	var r *outbox.Relay
	var once sync.Once
	sink := func(ctx context.Context, e outbox.Event) error {
		c, _ := outbox.ClaimFrom(ctx)
		out.printf("start %s %s %s %d\n", e.Key, e.Payload, c.Token, c.Epoch)
		once.Do(func() {
			out.printf("inflight\n")
			time.Sleep(300 * time.Millisecond)
		})
		out.printf("done %s %s %s %d\n", e.Key, e.Payload, c.Token, c.Epoch)
		return nil
	}
	r, err = ob.NewRelay(sink, outbox.WithWorkers(1), outbox.WithLeaseDuration(pausedLease),
		outbox.WithPollInterval(20*time.Millisecond), outbox.WithOwner("paused"),
		outbox.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
	if err != nil {
		panic(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	io.Copy(io.Discard, os.Stdin)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.Close(cctx); err != nil {
		fmt.Fprintln(os.Stderr, "close:", err)
	}
	if err := <-errc; err != nil {
		fmt.Fprintln(os.Stderr, "run:", err)
	}
	st := r.Stats()
	out.printf("stats published=%d marked=%d leaseslost=%d abandoned=%d\n", st.Published, st.Marked, st.LeasesLost, st.Abandoned)
	os.Exit(0)
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) printf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.w, format, args...)
}

// A relay process paused (SIGSTOP) for longer than its lease while a sink
// call is in flight, a second relay (this process) taking its keys over
// meanwhile, then continued (SIGCONT) while the second relay still holds
// the keys: the in-flight call returns (it ignores its context, as a broker
// completing a produce would) and is the only overlap: the event is also
// published by the second relay, under another claim (ClaimFrom: another
// token, a greater epoch). After it
// continues, the paused relay starts no other sink call (its queued rows of
// the lost keys are given back) and marks nothing (its mark of the
// in-flight row finds the lease another token's).
func TestPausedRelayProcess(t *testing.T) {
	srv := dbtest.NewServer(t)
	db := srv.Open(t)
	table := dbtest.Table(t, db, "pause")
	ob, err := outbox.New(db, outbox.WithTable(table))
	require.NoError(t, err)
	require.NoError(t, ob.CreateSchema(context.Background()))
	const keys, perKey = 2, 10
	writeEvents(t, ob, keys, perKey, 20)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(), pausedChildEnv+"="+srv.DSN(), "OUTBOX_PAUSE_TABLE="+table)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
	}()
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var before []string
	for l := range lines {
		before = append(before, l)
		if l == "inflight" {
			break
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	paused := time.Now()
	require.Equal(t, "inflight", before[len(before)-1], "child output: %v\n%s", before, stderr.String())
	first := strings.Fields(before[len(before)-2]) // start key j token epoch
	require.Equal(t, "start", first[0])
	childToken, childEpoch := first[3], first[4]

	// The child's leases end in the database; the second relay takes the
	// keys and publishes rows 0-4 of each, then holds them (its calls on
	// row 5 wait), renewing its leases.
	time.Sleep(3 * pausedLease)
	rec := newRecorder(keys * perKey)
	release := make(chan struct{})
	var claims sync.Map // "key j" -> the taker's claim that published it
	sink := func(ctx context.Context, e outbox.Event) error {
		if string(e.Payload) >= "5" && len(e.Payload) == 1 {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		c, ok := outbox.ClaimFrom(ctx)
		if !ok {
			return errors.New("no claim in the sink's context")
		}
		claims.Store(e.Key+" "+string(e.Payload), c)
		return rec.sink(ctx, e)
	}
	r, stop := startRelay(t, ob, sink, outbox.WithLeaseDuration(pausedLease), outbox.WithPollInterval(20*time.Millisecond),
		outbox.WithOwner("taker"), outbox.WithLogger(quiet))
	waitUntil(t, "rows 0-4 of every key", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.ids) == keys*5
	})
	require.Equal(t, keys, r.Stats().KeysHeld)
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	t.Logf("child paused for %v (lease %v)", time.Since(paused).Round(time.Millisecond), pausedLease)
	time.Sleep(time.Second) // renewals, polls and marks of the child
	close(release)
	rec.wait(t, 30*time.Second)
	waitUntil(t, "nothing pending", func() bool { return counts(t, ob)[outbox.Pending] == 0 })
	stop()
	require.NoError(t, stdin.Close())
	var after []string
	for l := range lines {
		after = append(after, l)
	}
	require.NoError(t, cmd.Wait(), "child stderr:\n%s", stderr.String())
	t.Logf("child before the pause: %v", before)
	t.Logf("child after: %v", after)
	t.Logf("child log:\n%s", stderr.String())

	var starts, dones int
	for _, l := range after {
		switch f := strings.Fields(l); f[0] {
		case "start":
			starts++
		case "done":
			dones++
			require.Equal(t, first[1:3], f[1:3], "the call that landed after the pause is the one in flight")
		}
	}
	require.Zero(t, starts, "the paused relay started no sink call after it continued")
	require.Equal(t, 1, dones, "its in-flight call is the only overlap")
	stats := after[len(after)-1]
	require.True(t, strings.HasPrefix(stats, "stats published=1 marked=0 "), "the paused relay published one row and marked none: %s", stats)
	// The overlapping event was published by the child (in flight across
	// the pause) and by the taker, under two claims: two tokens, two
	// epochs, the taker's greater (a downstream storing the epoch refuses
	// the child's late write). The taker published every event once.
	dups := rec.check(t, keys, perKey)
	require.Zero(t, dups, "the taker published each event once")
	v, ok := claims.Load(first[1] + " " + first[2])
	require.True(t, ok)
	taker := v.(outbox.Claim)
	t.Logf("the overlap: %s row %s published under epoch %s (token %s, paused) and epoch %d (token %s)", first[1], first[2], childEpoch, childToken, taker.Epoch, taker.Token)
	require.NotEqual(t, childToken, taker.Token)
	ce, err := strconv.ParseInt(childEpoch, 10, 64)
	require.NoError(t, err)
	require.Greater(t, taker.Epoch, ce, "the taker's claim has a greater epoch")
	n := 0
	claims.Range(func(_, v any) bool {
		require.NotEqual(t, childToken, v.(outbox.Claim).Token)
		n++
		return true
	})
	require.Equal(t, keys*perKey, n)
}
