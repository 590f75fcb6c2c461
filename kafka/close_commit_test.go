package kafka

import (
	"context"
	"errors"
	"fmt"
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

// committedOffset reads a group's committed offset of a partition from the
// broker (-1 when none).
func (tc *testCluster) committedOffset(t *testing.T, group, topic string, part int32) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tc.addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic = topic
	rt.Partitions = []int32{part}
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if rp.Partition == part {
				return rp.Offset
			}
		}
	}
	return -1
}

// produceSpread writes n records over parts partitions of topic, keys k0..k7
// (values: the record's index).
func (tc *testCluster) produceSpread(t *testing.T, topic string, parts, n int) {
	t.Helper()
	var rs []*kgo.Record
	for i := range n {
		rs = append(rs, rec(topic, int32(i%parts), fmt.Sprintf("k%d", i%8), fmt.Sprint(i)))
	}
	tc.produce(t, rs...)
}

// closeWithin closes c with a context of d and returns Close's error and
// how long it took.
func closeWithin(c *Consumer, d time.Duration) (error, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	t0 := time.Now()
	err := c.Close(ctx)
	return err, time.Since(t0)
}

// closeWithinMargin closes c with a context of d, checks that Close
// returned within d plus CloseMargin (plus a second: a loaded machine) and
// returns Close's error.
func closeWithinMargin(t *testing.T, c *Consumer, d time.Duration) error {
	t.Helper()
	err, took := closeWithin(c, d)
	if bound := d + CloseMargin + time.Second; took > bound {
		t.Errorf("Close took %v with a %v context (bound %v)", took, d, bound)
	}
	return err
}

// runConsumer makes a consumer of topic "t" in group (quiet log, 20 ms
// commit interval; opts come after those and may replace them) and runs it;
// Run's result comes on the channel. Unlike startConsumer it leaves Close to
// the test: Close is what these tests check.
func (tc *testCluster) runConsumer(t *testing.T, group string, h Handler, opts ...Option) (*Consumer, <-chan error) {
	t.Helper()
	base := []Option{WithLogger(quiet), WithCommitInterval(20 * time.Millisecond), WithClientOptions(tc.clientOpts(group, "t")...)}
	c, err := NewConsumer(h, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(context.Background()) }()
	return c, runDone
}

// runReturnsNil checks that Run, whose result comes on runDone, returned nil.
func runReturnsNil(t *testing.T, runDone <-chan error) {
	t.Helper()
	if err := <-runDone; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// holdRequests makes the broker hold every request of key from now on
// until release is closed; held, if not nil, is called for each.
func (tc *testCluster) holdRequests(key kmsg.Key, release <-chan struct{}, held func()) {
	tc.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
		tc.KeepControl()
		if held != nil {
			held()
		}
		tc.SleepControl(func() { <-release })
		return nil, nil, false
	})
}

// handleAll handles every record at once.
func handleAll(context.Context, *kgo.Record) error { return nil }

// failBadForGood fails the records whose value is "bad" for good
// (keysched.Permanent) and handles the others.
func failBadForGood(_ context.Context, r *kgo.Record) error {
	if string(r.Value) == "bad" {
		return keysched.Permanent(errors.New("bad record"))
	}
	return nil
}

// Offset commits failing for good while Close runs: every record was
// handled, nothing could be committed. Close returns within its context
// plus CloseGrace plus the documented final-commit margin, and says which
// frontiers it could not commit, with the broker's error: errors.Is
// ErrNotCommitted, errors.As *CommitError. Run returns nil.
func TestCloseReportsUncommittedFrontiers(t *testing.T) {
	// REQUEST_TIMED_OUT: kfake applies the commit before answering, so
	// Close finds it on the broker (TestCloseDoesNotReportACommitTheBrokerApplied).
	for _, code := range []*kerr.Error{kerr.CoordinatorNotAvailable, kerr.NotCoordinator, kerr.UnknownServerError,
		kerr.RebalanceInProgress, kerr.IllegalGeneration, kerr.OffsetMetadataTooLarge} {
		t.Run(code.Message, func(t *testing.T) {
			const N, parts = 40, 2
			tc := newCluster(t, parts, "t")
			group := groupName(t)
			tc.produceSpread(t, "t", parts, N)
			tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: code, Count: -1})
			c, runDone := tc.runConsumer(t, group, handleAll)
			eventually(t, "every record handled", func() bool { return c.Stats().Finished == N })
			const ctxD = 500 * time.Millisecond
			err := closeWithinMargin(t, c, ctxD)
			if !errors.Is(err, ErrNotCommitted) {
				t.Fatalf("Close: %v, want ErrNotCommitted", err)
			}
			var ce *CommitError
			if !errors.As(err, &ce) {
				t.Fatalf("Close: %v, want a *CommitError", err)
			}
			if len(ce.Partitions) != parts {
				t.Errorf("CommitError %+v: want %d partitions", ce, parts)
			}
			for _, pc := range ce.Partitions {
				if pc.Topic != "t" || pc.Offset != N/parts || pc.Committed != -1 || !errors.Is(pc.Err, code) {
					t.Errorf("uncommitted %+v: want topic t, offset %d, committed -1, err %v", pc, N/parts, code)
				}
			}
			runReturnsNil(t, runDone)
			for p := range int32(parts) {
				if off := tc.committedOffset(t, group, "t", p); off != -1 {
					t.Errorf("partition %d: committed %d, yet Close said it could not", p, off)
				}
			}
		})
	}
}

// Offset commits failing for a while (8 requests) when Close starts, every
// record handled: Close does not work through the failed commits one after
// another past its context (it waited for the interval commit in flight,
// which franz-go retried with a growing backoff: 23 s with a 30 s context),
// and what it says is true: nil only with every frontier committed on the
// broker, else the frontiers it could not commit, with the offsets the
// broker holds.
func TestCloseWhileCommitsFailForAWhile(t *testing.T) {
	const N, parts = 40, 2
	tc := newCluster(t, parts, "t")
	group := groupName(t)
	tc.produceSpread(t, "t", parts, N)
	f := tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.CoordinatorNotAvailable, Count: 8})
	c, runDone := tc.runConsumer(t, group, handleAll)
	eventually(t, "every record handled, commits failing", func() bool { return c.Stats().Finished == N && f.Hits() >= 2 })
	const ctxD = time.Second
	err := closeWithinMargin(t, c, ctxD)
	runReturnsNil(t, runDone)
	if err == nil {
		for p := range int32(parts) {
			if off := tc.committedOffset(t, group, "t", p); off != N/parts {
				t.Errorf("Close returned nil, yet partition %d has %d committed, want %d", p, off, N/parts)
			}
		}
		return
	}
	var ce *CommitError
	if !errors.Is(err, ErrNotCommitted) || !errors.As(err, &ce) {
		t.Fatalf("Close: %v, want nil or a *CommitError", err)
	}
	for _, pc := range ce.Partitions {
		if off := tc.committedOffset(t, group, pc.Topic, pc.Partition); off != pc.Committed || pc.Offset != N/parts {
			t.Errorf("uncommitted %+v: the broker holds %d", pc, off)
		}
	}
}

// Leaving the group failing for good (LeaveGroup answered
// COORDINATOR_NOT_AVAILABLE, retried by franz-go) or never answered: Close
// still returns within its context plus CloseMargin, with nil (everything
// was handled and committed; the group drops the member at its session
// timeout), and Run returns nil.
func TestCloseBoundedWhenLeavingFails(t *testing.T) {
	for _, slow := range []bool{false, true} {
		t.Run(map[bool]string{false: "COORDINATOR_NOT_AVAILABLE", true: "no answer"}[slow], func(t *testing.T) {
			const N, parts = 20, 2
			tc := newCluster(t, parts, "t")
			group := groupName(t)
			tc.produceSpread(t, "t", parts, N)
			release := make(chan struct{})
			defer close(release)
			if slow {
				tc.holdRequests(kmsg.LeaveGroup, release, nil)
			} else {
				tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.LeaveGroup}, Group: group, Err: kerr.CoordinatorNotAvailable, Count: -1})
			}
			c, runDone := tc.runConsumer(t, group, handleAll)
			eventually(t, "every record handled", func() bool { return c.Stats().Finished == N })
			const ctxD = 300 * time.Millisecond
			err := closeWithinMargin(t, c, ctxD)
			if err != nil {
				t.Errorf("Close: %v", err)
			}
			runReturnsNil(t, runDone)
		})
	}
}

// The dead-letter topic refusing writes for good while Close runs: the
// failed record stays unfinished (its key waits, the frontier holds at it),
// Close returns within its context plus CloseMargin, says one record was
// left unfinished, and commits the frontier at that record; the next owner
// handles it.
func TestCloseWhileDeadLettersFail(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	group := groupName(t)
	tc.produce(t, rec("t", 0, "a", "0"), rec("t", 0, "b", "bad"), rec("t", 0, "b", "2"), rec("t", 0, "c", "3"))
	f := tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "dlq", Err: kerr.NotLeaderForPartition, Count: -1})
	logs := &logBuffer{}
	c, runDone := tc.runConsumer(t, group, failBadForGood, WithLogger(logs.logger()), WithDeadLetterTopic("dlq"))
	eventually(t, "the dead letter failing, the others handled", func() bool {
		ps, _ := c.partStats("t", 0)
		return f.Hits() >= 1 && c.Stats().Finished == 2 && ps.Frontier == 1 && ps.InFlight == 2 &&
			strings.Contains(logs.String(), "dead-letter produce failing")
	})
	const ctxD = 300 * time.Millisecond
	err := closeWithinMargin(t, c, ctxD)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "2 records unfinished") || errors.Is(err, ErrNotCommitted) {
		t.Errorf("Close: %v, want 2 records unfinished (the failed one and the next of its key), the frontier committed", err)
	}
	runReturnsNil(t, runDone)
	if off := tc.committedOffset(t, group, "t", 0); off != 1 {
		t.Errorf("committed %d, want 1 (the record whose dead letter failed)", off)
	}
	if n := strings.Count(logs.String(), "dead-letter produce failing"); n != 1 {
		t.Errorf("%d 'failing' log lines for one lasting fault, want 1:\n%s", n, logs.String())
	}
}

// A commit the broker applied but answered REQUEST_TIMED_OUT (kfake applies
// the commit, then answers with the fault's error, as a broker whose answer
// timed out may): Close must not say the frontier was not committed, nor
// that the next owner starts at an older offset. Input that broke it: every
// OffsetCommit of the group answered REQUEST_TIMED_OUT, 40 records on 2
// partitions all handled, Close with a 500 ms context: Close returned a
// *CommitError "2 frontiers not committed ... committed -1" while the broker
// held 20 on both partitions.
func TestCloseDoesNotReportACommitTheBrokerApplied(t *testing.T) {
	const N, parts = 40, 2
	tc := newCluster(t, parts, "t")
	group := groupName(t)
	tc.produceSpread(t, "t", parts, N)
	tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.RequestTimedOut, Count: -1})
	c, runDone := tc.runConsumer(t, group, handleAll)
	eventually(t, "every record handled", func() bool { return c.Stats().Finished == N })
	const ctxD = 500 * time.Millisecond
	err := closeWithinMargin(t, c, ctxD)
	runReturnsNil(t, runDone)
	var ce *CommitError
	if errors.As(err, &ce) {
		for _, pc := range ce.Partitions {
			if off := tc.committedOffset(t, group, pc.Topic, pc.Partition); off != pc.Committed || off == pc.Offset {
				t.Errorf("Close says %s/%d not committed at %d (committed %d); the broker holds %d", pc.Topic, pc.Partition, pc.Offset, pc.Committed, off)
			}
		}
	} else if err != nil {
		t.Errorf("Close: %v, want nil (every frontier is on the broker)", err)
	}
	for p := range int32(parts) {
		if off := tc.committedOffset(t, group, "t", p); off != N/parts {
			t.Errorf("partition %d: the broker holds %d, want %d", p, off, N/parts)
		}
	}
}

// The dead-letter topic never answering a produce (kfake holds the Produce
// request) while Close runs: Close returns within its context plus
// CloseMargin, names the records left unfinished, commits the frontier at
// the record whose dead letter hangs, and no goroutine of the consumer is
// left (goleak, TestMain).
func TestCloseWhileADeadLetterProduceHangs(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	group := groupName(t)
	tc.produce(t, rec("t", 0, "a", "0"), rec("t", 0, "b", "bad"), rec("t", 0, "c", "2"))
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	var held atomic.Int32
	// Every Produce from now on is a dead letter's.
	tc.holdRequests(kmsg.Produce, release, func() { held.Add(1) })
	c, runDone := tc.runConsumer(t, group, failBadForGood, WithDeadLetterTopic("dlq"))
	eventually(t, "the dead letter's produce held, the others handled", func() bool {
		ps, _ := c.partStats("t", 0)
		return held.Load() >= 1 && c.Stats().Finished == 2 && ps.Frontier == 1
	})
	const ctxD = 300 * time.Millisecond
	err := closeWithinMargin(t, c, ctxD)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 records unfinished") || errors.Is(err, ErrNotCommitted) {
		t.Errorf("Close: %v, want 1 record unfinished, the frontier committed", err)
	}
	runReturnsNil(t, runDone)
	once.Do(func() { close(release) })
	if off := tc.committedOffset(t, group, "t", 0); off != 1 {
		t.Errorf("committed %d, want 1 (the record whose dead letter hangs)", off)
	}
}

// A second Close while a first one waits without a deadline (for a handler
// that runs until released): the second returns within its own context
// plus CloseMargin, with an error wrapping its context's error, and later
// calls return the first one's result once it is done. Input that broke
// it: Close(context.Background()) draining a handler stuck for good, then
// Close with a 100 ms context: the second call blocked as long as the
// first (for ever), though Close promises to return within ctx plus
// CloseMargin.
func TestCloseWhileAnotherCloseRunsKeepsItsBound(t *testing.T) {
	tc := newCluster(t, 1, "t")
	group := groupName(t)
	tc.produce(t, rec("t", 0, "a", "0"))
	release := make(chan struct{})
	var running atomic.Bool
	c, runDone := tc.runConsumer(t, group, func(context.Context, *kgo.Record) error {
		running.Store(true)
		<-release // ignores its context: the first Close waits for it
		return nil
	})
	eventually(t, "the handler running", running.Load)
	first := make(chan error, 1)
	go func() { first <- c.Close(context.Background()) }()
	eventually(t, "the first Close started", func() bool { return c.closing.Load() })
	const ctxD = 100 * time.Millisecond
	done := make(chan struct{})
	var err2 error
	var took time.Duration
	go func() { err2, took = closeWithin(c, ctxD); close(done) }()
	select {
	case <-done:
		if bound := ctxD + CloseMargin + time.Second; took > bound {
			t.Errorf("the second Close took %v with a %v context (bound %v)", took, ctxD, bound)
		}
		if !errors.Is(err2, context.DeadlineExceeded) {
			t.Errorf("the second Close: %v, want DeadlineExceeded", err2)
		}
	case <-time.After(ctxD + CloseMargin + 2*time.Second):
		t.Errorf("the second Close did not return within its context plus CloseMargin")
	}
	close(release)
	if err := <-first; err != nil {
		t.Errorf("the first Close: %v", err)
	}
	<-done
	if err := c.Close(context.Background()); err != nil {
		t.Errorf("a later Close: %v, want the first one's result", err)
	}
	runReturnsNil(t, runDone)
}

// Close with a context that has already ended, while the coordinator
// refuses every OffsetCommit (COORDINATOR_NOT_AVAILABLE) and never answers
// a LeaveGroup (kfake holds it): Close returns within CloseMargin of its
// start. Input that broke it: the phases' bounds were each measured from
// when the phase began once ctx had ended (final commit 1 s, then leaving
// 1.5 s, then franz-go's close 1 s): Close took 3.5 s, past CloseMargin.
func TestCloseWithAnEndedContextKeepsTheMarginWhileCommitsFail(t *testing.T) {
	tc := newCluster(t, 2, "t")
	group := groupName(t)
	tc.produceSpread(t, "t", 2, 20)
	c, runDone := tc.runConsumer(t, group, handleAll)
	eventually(t, "every record handled", func() bool { return c.Stats().Finished == 20 })
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	tc.holdRequests(kmsg.LeaveGroup, release, nil)
	f := tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.CoordinatorNotAvailable, Count: -1})
	tc.produceSpread(t, "t", 2, 20)
	eventually(t, "every record handled, a commit refused", func() bool { return c.Stats().Finished == 40 && f.Hits() > 0 })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	t0 := time.Now()
	err := c.Close(ctx)
	// CloseMargin plus 300 ms for a loaded machine.
	if took := time.Since(t0); took > CloseMargin+300*time.Millisecond {
		t.Errorf("Close with an ended context took %v (CloseMargin %v)", took, CloseMargin)
	}
	if !errors.Is(err, ErrNotCommitted) {
		t.Errorf("Close: %v, want ErrNotCommitted", err)
	}
	once.Do(func() { close(release) })
	runReturnsNil(t, runDone)
}
