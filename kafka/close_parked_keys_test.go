package kafka

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Close with a context that never ends returns although a key is parked:
// once Close has started, Resume and Skip refuse (ErrClosed), so nothing
// could finish the parked key's records. It drains the rest, says the
// parked records are left unfinished (their frontier is committed at the
// parked record: the next owner handles them), and returns. Before, it
// waited for the parked key for ever, and a later Close with a deadline
// only said "another Close is still running".
func TestCloseWithoutADeadlineLeavesParkedKeysToTheNextOwner(t *testing.T) {
	tc := newCluster(t, 1, "t")
	tc.produce(t, rec("t", 0, "a", "a0"), rec("t", 0, "a", "a1"), rec("t", 0, "b", "b0"))
	h := func(_ context.Context, r *kgo.Record) error {
		if string(r.Value) == "a0" {
			return errors.New("fails")
		}
		return nil
	}
	commits := tc.watchCommits(t)
	group := groupName(t)
	c, err := NewConsumer(h, WithLogger(quiet), WithCommitInterval(5*time.Millisecond),
		WithSchedulerOptions(keysched.WithFailurePolicy(keysched.Park)),
		WithClientOptions(tc.clientOpts(group, "t")...))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	eventually(t, "a parked, b handled", func() bool {
		ps, _ := c.partStats("t", 0)
		return len(c.Parked()) == 1 && ps.HighestFetched == 2 && c.Stats().Succeeded == 1
	})
	closed := make(chan error, 1)
	go func() { closed <- c.Close(context.Background()) }()
	select {
	case err = <-closed:
	case <-time.After(20 * time.Second):
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		t.Fatalf("Close(context.Background()) still waits for the parked key after 20 s (a later Close: %v)", c.Close(ctx))
	}
	if !errors.Is(err, ErrLeftParked) || errors.Is(err, ErrNotCommitted) || !strings.Contains(err.Error(), "2 records unfinished, held by 1 parked keys") {
		t.Errorf("Close: %v, want ErrLeftParked counting the parked key's 2 records, and the frontier committed", err)
	}
	if err := <-ran; err != nil {
		t.Errorf("Run: %v", err)
	}
	if cs := commits.of("t", 0); len(cs) == 0 || cs[len(cs)-1].Offset != 0 {
		t.Errorf("commits %+v, want the last at the parked record, 0", cs)
	}

	// The next owner handles the parked key's records, in order.
	var mu sync.Mutex
	var again []string
	startConsumer(t, func(_ context.Context, r *kgo.Record) error {
		mu.Lock()
		again = append(again, string(r.Value))
		mu.Unlock()
		return nil
	}, WithLogger(quiet), WithClientOptions(tc.clientOpts(group, "t")...))
	eventually(t, "the next owner handled a0 and a1", func() bool { mu.Lock(); defer mu.Unlock(); return len(again) >= 2 })
	mu.Lock()
	defer mu.Unlock()
	if again[0] != "a0" || again[1] != "a1" {
		t.Errorf("the next owner handled %v first; want a0, a1", again)
	}
}

// A Skip whose dead letter is being written when Close starts is waited
// for (it holds its partition, as a running handler does): once the broker
// acknowledges the dead letter, Skip returns nil, the key moves on, and
// Close drains it and returns nil. Close does not take the skipped key for
// a parked one and cut the Skip short.
func TestCloseWaitsForASkipInFlight(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	group := groupName(t)
	tc.produce(t, rec("t", 0, "a", "bad"), rec("t", 0, "a", "a1"))
	c, runDone := tc.runConsumer(t, group, failBadForGood, WithDeadLetterTopic("dlq"),
		WithSchedulerOptions(keysched.WithFailurePolicy(keysched.Park)))
	eventually(t, "a parked", func() bool { return len(c.Parked()) == 1 })
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	var held atomic.Int32
	tc.holdRequests(kmsg.Produce, release, func() { held.Add(1) }) // the dead letter's
	skipped := make(chan error, 1)
	go func() { skipped <- c.Skip(c.Parked()[0]) }()
	eventually(t, "the dead letter's produce held", func() bool { return held.Load() >= 1 })
	closed := make(chan error, 1)
	go func() { closed <- c.Close(context.Background()) }()
	time.Sleep(100 * time.Millisecond) // Close looks at the scheduler meanwhile
	once.Do(func() { close(release) })
	if err := <-skipped; err != nil {
		t.Errorf("Skip: %v", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	runReturnsNil(t, runDone)
	if off := tc.committedOffset(t, group, "t", 0); off != 2 {
		t.Errorf("committed %d, want 2", off)
	}
}

// ErrLeftParked's message counts the parked keys' records apart from the
// records held back behind them (never dispatched: the scheduler was full
// with the parked key's): it counted every record in flight as a parked
// key's ("2 records of 1 parked keys" for a0 parked and b0 held).
func TestCloseLeftParkedCountsOnlyParkedKeysRecords(t *testing.T) {
	tc := newCluster(t, 1, "t")
	tc.produce(t, rec("t", 0, "a", "a0"), rec("t", 0, "b", "b0"))
	group := groupName(t)
	h := func(ctx context.Context, r *kgo.Record) error {
		if string(r.Value) == "a0" {
			return keysched.Permanent(errors.New("refused"))
		}
		return nil
	}
	c, err := NewConsumer(h, WithLogger(quiet),
		WithSchedulerOptions(keysched.WithFailurePolicy(keysched.Park), keysched.WithMaxPending(1)),
		WithClientOptions(tc.clientOpts(group, "t")...))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	eventually(t, "a parked, b0 held", func() bool { return len(c.Parked()) == 1 && c.Stats().Fetched == 2 })
	err = c.Close(context.Background())
	if e := <-ran; e != nil {
		t.Errorf("Run: %v", e)
	}
	if !errors.Is(err, ErrLeftParked) {
		t.Fatalf("Close: %v; want ErrLeftParked", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "1 records unfinished, held by 1 parked keys") || !strings.Contains(msg, "1 records of other keys held back") {
		t.Errorf("Close's error %q does not count the parked key's record (a0) apart from the one held back (b0)", msg)
	}
}

// A Resume that has not taken its parked key yet when Close starts returns
// ErrClosed: Close's check that only parked keys are left must not meet a
// Resume or Skip that looked at closing before Close started and takes the
// key after the check (Close would then leave, and interrupt, the record
// the Resume ran again, or the records a Skip moved the key on to). The
// Resume is held on the parked set's lock (as a descheduled goroutine
// would be) between its look at closing and taking the key.
func TestResumeNotYetTakingItsKeyWhenCloseStartsReturnsErrClosed(t *testing.T) {
	tc := newCluster(t, 1, "t")
	tc.produce(t, rec("t", 0, "a", "a0"), rec("t", 0, "a", "a1"))
	h := func(ctx context.Context, r *kgo.Record) error {
		return keysched.Permanent(errors.New("refused"))
	}
	c, err := NewConsumer(h, WithLogger(quiet),
		WithSchedulerOptions(keysched.WithFailurePolicy(keysched.Park)),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	eventually(t, "a parked", func() bool { return len(c.Parked()) == 1 })
	k := c.Parked()[0]

	c.parkMu.Lock()
	resumed := make(chan error, 1)
	go func() { resumed <- c.Resume(k) }()
	time.Sleep(100 * time.Millisecond) // Resume looked at closing and waits for the lock
	closed := make(chan error, 1)
	go func() { closed <- c.Close(context.Background()) }()
	eventually(t, "Close started", c.closing.Load)
	c.parkMu.Unlock()

	if err := <-resumed; !errors.Is(err, ErrClosed) {
		t.Errorf("Resume: %v; want ErrClosed (Close had started before it took the key)", err)
	}
	if err := <-closed; !errors.Is(err, ErrLeftParked) {
		t.Errorf("Close: %v; want ErrLeftParked", err)
	}
	if err := <-ran; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// ErrLeftParked's counts (parkedLeft) ignore keys parked on a partition
// taken away (revoked or lost, not yet forgotten; or assigned again): such
// a key is the next owner's, not one this Close leaves.
func TestParkedLeftIgnoresKeysOfPartitionsTakenAway(t *testing.T) {
	c := &Consumer{parts: map[tp]*partition{}, parked: map[schedKey]*item{}}
	gone := newPartition(c, "t", 0, 1)
	gone.state.Store(stGone)
	k := schedKey{topic: "t", part: 0, key: "a", off: -1}
	it := &item{p: gone, off: 0}
	g := c.newGroupOf(gone, k, false, "a", it)
	g.comp.Store(&keysched.Completion{})
	gone.queue = append(gone.queue, it)
	c.parked[k] = it
	owned := newPartition(c, "t", 1, 2) // owned, nothing unfinished
	c.parts[tp{"t", 1}] = owned
	if records, others, keys := c.parkedLeft(); records != 0 || others != 0 || keys != 0 {
		t.Fatalf("parkedLeft: %d records, %d others, %d keys; want none", records, others, keys)
	}
}

// A Skip that ends while Close's check that only parked keys are left is
// looking does not make that check say yes: the check read the scheduler
// while the key was still parked (its dead letter written, the key not yet
// moved on) and looked for a Resume or Skip at work only after the Skip had
// returned, so Close stopped waiting and interrupted the record the Skip
// had moved the key on to (ErrLeftParked, "0 records ... held by 0 parked
// keys"). The Skip is held on its partition's lock between its dead letter
// and moving the key on, and the check on the parked set's lock (as
// descheduled goroutines would be), so that the Skip returns in between.
func TestCloseWaitsForTheRecordASkipEndingDuringItsCheckMovedOn(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	group := groupName(t)
	tc.produce(t, rec("t", 0, "a", "bad"), rec("t", 0, "a", "a1"))
	a1 := make(chan struct{})
	h := func(ctx context.Context, r *kgo.Record) error {
		if string(r.Value) != "a1" {
			return failBadForGood(ctx, r)
		}
		select {
		case <-a1:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c, runDone := tc.runConsumer(t, group, h, WithDeadLetterTopic("dlq"),
		WithSchedulerOptions(keysched.WithFailurePolicy(keysched.Park)))
	eventually(t, "a parked", func() bool { return len(c.Parked()) == 1 })
	k := c.Parked()[0]
	p := c.lookup("t", 0)
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	var held atomic.Int32
	tc.holdRequests(kmsg.Produce, release, func() { held.Add(1) }) // the dead letter's
	skipped := make(chan error, 1)
	go func() { skipped <- c.Skip(k) }()
	eventually(t, "the dead letter's produce held", func() bool { return held.Load() >= 1 })
	closed := make(chan error, 1)
	go func() { closed <- c.Close(context.Background()) }()
	runReturnsNil(t, runDone)
	time.Sleep(100 * time.Millisecond) // Close drains, its committer ended

	p.mu.Lock()
	c.parkMu.Lock()
	once.Do(func() { close(release) })
	eventually(t, "the Skip's dead letter written", func() bool { return p.running.Load() == 0 })
	time.Sleep(100 * time.Millisecond) // Close's check read the scheduler, waits for parkMu
	p.mu.Unlock()
	if err := <-skipped; err != nil {
		t.Errorf("Skip: %v", err)
	}
	c.parkMu.Unlock()
	time.Sleep(100 * time.Millisecond) // Close's check decides
	close(a1)
	if err := <-closed; err != nil {
		t.Errorf("Close: %v; want nil (a1, which the Skip moved the key on to, handled)", err)
	}
	if off := tc.committedOffset(t, group, "t", 0); off != 2 {
		t.Errorf("committed %d, want 2", off)
	}
}

// A Skip in flight when Close starts, whose key is at its depth bound, is
// waited for with the record it moves the key on to: that record (handed on
// to a group of its own, held back while the skipped one still held the
// key's only slot) was dispatched, and the poll loop, which dispatched held
// groups, has ended. Close returned nil with it unfinished and never
// handled (the frontier at it).
func TestCloseWaitsForTheRecordASkipMovesOnToAKeyAtItsBound(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	group := groupName(t)
	tc.produce(t, rec("t", 0, "a", "bad"), rec("t", 0, "a", "a1"))
	c, runDone := tc.runConsumer(t, group, failBadForGood, WithDeadLetterTopic("dlq"),
		WithSchedulerOptions(keysched.WithFailurePolicy(keysched.Park), keysched.WithMaxKeyDepth(1)))
	eventually(t, "a parked, a1 fetched", func() bool { return len(c.Parked()) == 1 && c.Stats().Fetched == 2 })
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	var held atomic.Int32
	tc.holdRequests(kmsg.Produce, release, func() { held.Add(1) }) // the dead letter's
	skipped := make(chan error, 1)
	go func() { skipped <- c.Skip(c.Parked()[0]) }()
	eventually(t, "the dead letter's produce held", func() bool { return held.Load() >= 1 })
	closed := make(chan error, 1)
	go func() { closed <- c.Close(context.Background()) }()
	runReturnsNil(t, runDone) // the poll loop ended
	once.Do(func() { close(release) })
	if err := <-skipped; err != nil {
		t.Errorf("Skip: %v", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	if s := c.Stats(); s.Succeeded != 1 {
		t.Errorf("%d records handled, want 1 (a1)", s.Succeeded)
	}
	if off := tc.committedOffset(t, group, "t", 0); off != 2 {
		t.Errorf("committed %d, want 2", off)
	}
}

// The same without parking: a dead letter being written when Close starts,
// at a key at its depth bound, moves the key on to the failed record's
// group's later records (handed on to a group held back while the failed
// one held the key's only slot): Close waits for them too. It returned nil
// with them never handled.
func TestCloseWaitsForTheRecordsADeadLetterMovesOnToAKeyAtItsBound(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	group := groupName(t)
	tc.produce(t, rec("t", 0, "a", "bad"), rec("t", 0, "a", "a1"))
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	var held atomic.Int32
	tc.holdRequests(kmsg.Produce, release, func() { held.Add(1) }) // the dead letter's
	c, runDone := tc.runConsumer(t, group, failBadForGood, WithDeadLetterTopic("dlq"),
		WithSchedulerOptions(keysched.WithMaxKeyDepth(1)))
	eventually(t, "the dead letter's produce held", func() bool { return held.Load() >= 1 })
	closed := make(chan error, 1)
	go func() { closed <- c.Close(context.Background()) }()
	runReturnsNil(t, runDone) // the poll loop ended
	once.Do(func() { close(release) })
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	if s := c.Stats(); s.Succeeded != 1 || s.DeadLettered != 1 {
		t.Errorf("%d records handled, %d dead-lettered; want 1 (a1) and 1 (bad)", s.Succeeded, s.DeadLettered)
	}
	if off := tc.committedOffset(t, group, "t", 0); off != 2 {
		t.Errorf("committed %d, want 2", off)
	}
}

// Close with a context that has already ended (Run's, after a signal) says
// that only parked keys' records are left when they are: ErrLeftParked,
// counting them. It said "2 records unfinished ...: context canceled", as
// if Close had run out of time with work under way: Drain returned at once,
// before the first look for parked keys.
func TestCloseWithAnEndedContextSaysOnlyParkedKeysAreLeft(t *testing.T) {
	tc := newCluster(t, 1, "t")
	tc.produce(t, rec("t", 0, "a", "bad"), rec("t", 0, "a", "a1"))
	c, runDone := tc.runConsumer(t, groupName(t), failBadForGood,
		WithSchedulerOptions(keysched.WithFailurePolicy(keysched.Park)))
	eventually(t, "a parked, a1 fetched", func() bool { return len(c.Parked()) == 1 && c.Stats().Fetched == 2 })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := c.Close(ctx)
	if !errors.Is(err, ErrLeftParked) || !strings.Contains(err.Error(), "2 records unfinished, held by 1 parked keys") {
		t.Errorf("Close: %v; want ErrLeftParked counting the parked key's 2 records", err)
	}
	runReturnsNil(t, runDone)
}

// A Skip in flight when Close starts whose dead letter the broker refuses
// for good (INVALID_RECORD) leaves its key parked: Close waits for it, then
// says ErrLeftParked counting that key and its records (the frontier at the
// parked record), and does not wait for ever.
func TestCloseWaitsForASkipWhoseDeadLetterFailsAndLeavesItsKeyParked(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	group := groupName(t)
	tc.produce(t, rec("t", 0, "a", "bad"), rec("t", 0, "a", "a1"), rec("t", 0, "b", "b0"))
	c, runDone := tc.runConsumer(t, group, failBadForGood, WithDeadLetterTopic("dlq"),
		WithSchedulerOptions(keysched.WithFailurePolicy(keysched.Park)))
	eventually(t, "a parked, b0 handled", func() bool { return len(c.Parked()) == 1 && c.Stats().Succeeded == 1 })
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	var held atomic.Int32
	tc.holdRequests(kmsg.Produce, release, func() { held.Add(1) }) // the dead letter's, then refused
	refuse := tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "dlq", Err: kerr.InvalidRecord, Count: -1})
	defer refuse.Remove()
	skipped := make(chan error, 1)
	go func() { skipped <- c.Skip(c.Parked()[0]) }()
	eventually(t, "the dead letter's produce held", func() bool { return held.Load() >= 1 })
	closed := make(chan error, 1)
	go func() { closed <- c.Close(context.Background()) }()
	runReturnsNil(t, runDone)
	time.Sleep(50 * time.Millisecond) // Close drains meanwhile
	once.Do(func() { close(release) })
	if err := <-skipped; !errors.Is(err, kerr.InvalidRecord) {
		t.Errorf("Skip: %v; want the broker's INVALID_RECORD", err)
	}
	select {
	case err := <-closed:
		if !errors.Is(err, ErrLeftParked) || !strings.Contains(err.Error(), "2 records unfinished, held by 1 parked keys") {
			t.Errorf("Close: %v; want ErrLeftParked counting the key the Skip left parked and its 2 records", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close still waits 20 s after the Skip failed")
	}
	if off := tc.committedOffset(t, group, "t", 0); off != 0 {
		t.Errorf("committed %d, want 0 (the parked record)", off)
	}
}
