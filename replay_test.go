package keysched_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/trace"
)

// The end-to-end check of the design notes: a real keyed event stream,
// applied through the scheduler, gives zero broken preconditions and the same
// final state as a sequential replay. The stream is the first-parent history
// of git/git (see cmd/keybench/data/README.md): one event per file a commit
// changes, each expecting the file's previous blob, so any reordering of two
// events of one key breaks a precondition.

// fullStream is the whole stream, in the benchmark module's directory: the
// test that uses it fails when it is missing from the repository, and skips
// outside it (the core module's zip, which does not carry it).
const fullStream = "cmd/keybench/data/git-history.tsv.gz"

// replayResult is what applying a stream through a scheduler saw.
type replayResult struct {
	violations int64 // events that found their key in another state than they expect
	overlaps   int64 // events that started while another event of their key ran
	mismatches int   // keys whose final state differs from the sequential replay
	stats      keysched.Stats
}

// replay applies events through a new scheduler built with opts, submitted
// by the given number of publisher goroutines. Each publisher owns whole keys
// (all of a key's events go through one publisher, in stream order), so that
// acceptance order per key is stream order.
func replay(t *testing.T, events []trace.Event, publishers int, opts ...keysched.Option) replayResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a watchdog, not a timing assertion
	defer cancel()
	s, err := keysched.New[string](append([]keysched.Option{keysched.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)...)
	require.NoError(t, err)

	ids, keys := trace.KeyIDs(events)
	state := make([]atomic.Pointer[string], len(keys)) // nil: key absent
	busy := make([]atomic.Int32, len(keys))
	var violations, overlaps atomic.Int64
	task := func(i int) keysched.Task {
		e, id := &events[i], ids[i]
		return func(context.Context) error {
			if busy[id].Add(1) != 1 {
				overlaps.Add(1)
			}
			cur := ""
			if p := state[id].Load(); p != nil {
				cur = *p
			}
			if !trace.Holds(cur, e.PrevBlob) {
				violations.Add(1)
			}
			state[id].Store(&e.NextBlob)
			if i%61 == 0 {
				runtime.Gosched() // let other workers in while this key is held
			}
			busy[id].Add(-1)
			return nil
		}
	}

	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range events {
				if int(ids[i])%publishers != p {
					continue
				}
				if _, err := s.Submit(ctx, events[i].Key, task(i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, s.Drain(ctx))
	require.NoError(t, s.Close(ctx))

	res := replayResult{violations: violations.Load(), overlaps: overlaps.Load(), stats: s.Stats()}
	final, broken := trace.Replay(events)
	require.Zero(t, broken, "the stream itself must hold its chain")
	require.Len(t, final, len(keys))
	for id, k := range keys {
		if p := state[id].Load(); p == nil || *p != final[k] {
			res.mismatches++
		}
	}
	return res
}

func requireClean(t *testing.T, events []trace.Event, r replayResult) {
	t.Helper()
	require.Zero(t, r.violations, "order violations")
	require.Zero(t, r.overlaps, "two events of one key ran at once")
	require.Zero(t, r.mismatches, "keys whose final state differs from the sequential replay")
	n := uint64(len(events))
	require.Equal(t, n, r.stats.Submitted)
	require.Equal(t, n, r.stats.Succeeded)
	require.Zero(t, r.stats.Pending)
	require.Zero(t, r.stats.Keys, "every key's chain is removed once drained")
}

func TestReplaySample(t *testing.T) {
	events := trace.Sample()
	require.NoError(t, trace.CheckChain(events))
	r := replay(t, events, 1, keysched.WithWorkers(4))
	requireClean(t, events, r)
}

// Tight bounds: the publisher keeps waiting for room on hot keys and on the
// whole scheduler, so admission's wake-ups are on the path of every event.
func TestReplaySampleTightBounds(t *testing.T) {
	events := trace.Limit(trace.Sample(), 8000)
	r := replay(t, events, 1, keysched.WithWorkers(3), keysched.WithMaxKeyDepth(2), keysched.WithMaxPending(16))
	requireClean(t, events, r)
}

// Several publishers, each owning a share of the keys (so acceptance order
// per key is still stream order), over two rounds of the sample.
func TestReplaySampleConcurrentPublishers(t *testing.T) {
	events := trace.Rounds(trace.Limit(trace.Sample(), 6000), 2)
	r := replay(t, events, 4, keysched.WithWorkers(4), keysched.WithMaxKeyDepth(8), keysched.WithMaxPending(256))
	requireClean(t, events, r)
}

func TestReplayFullStream(t *testing.T) {
	if fullStreamUnderRace {
		t.Skip("under -race the full stream takes 25-50 s: .ci/run runs this test without -race")
	}
	if _, err := os.Stat(fullStream); err != nil {
		if _, inRepo := os.Stat("go.work"); inRepo == nil {
			t.Fatalf("the repository's stream is missing: %v", err)
		}
		t.Skipf("outside the repository (no go.work): the stream is in the cmd/keybench module: %v", err)
	}
	if testing.Short() {
		t.Skip("-short: the full stream takes a few seconds")
	}
	events, err := trace.LoadFile(fullStream)
	require.NoError(t, err)
	require.Len(t, events, 96_875)
	r := replay(t, events, 1, keysched.WithWorkers(8))
	requireClean(t, events, r)
}
