package kafka

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// faultRun is what a fault of the matrix acts on.
type faultRun struct {
	t     *testing.T
	tc    *testCluster
	group string
	s     *streamChecker
	c     *Consumer // the member (nil before it starts, for faults at start)
	gen0  int32     // the group generation before the fault
	// restart replaces the cluster (see the "cluster restarted" fault).
	restart func()
}

// hitsWhile installs f until it answered n requests (producing a few
// records meanwhile, so that fetches, commits and heartbeats go on), then
// removes it: a fault "for a while". The test fails if the fault is never
// hit: every fault of the matrix is injected for real.
func (r *faultRun) hitsWhile(n int, fs ...kfake.Fault) {
	r.t.Helper()
	for i := range fs {
		fs[i].Count = -1
	}
	h := r.tc.Fault(fs...)
	defer h.Remove()
	deadline := time.Now().Add(20 * time.Second)
	for h.Hits() < n {
		if time.Now().After(deadline) {
			r.t.Fatalf("the fault answered %d requests of %d in 20 s", h.Hits(), n)
		}
		r.s.produce(r.tc, 4)
		time.Sleep(20 * time.Millisecond)
	}
}

// underLoad runs act a few times with records produced in between.
func (r *faultRun) underLoad(times int, act func()) {
	for range times {
		act()
		r.s.produce(r.tc, 6)
		time.Sleep(30 * time.Millisecond)
	}
}

type brokerFault struct {
	name    string
	brokers int           // default 1
	atStart bool          // inject before the member starts (requests it makes only when joining)
	dlq     bool          // some records fail for good, and are dead-lettered
	kip848  bool          // the KIP-848 consumer group protocol (else the classic one, cooperative-sticky)
	session time.Duration // the member's session timeout (default: clientOpts')
	inject  func(r *faultRun)
	// check, if set, checks what this fault must leave behind (after the
	// common invariants).
	check func(r *faultRun)
}

// commitFault fails offset commits of the group with code for a while.
func commitFault(code *kerr.Error) func(*faultRun) {
	return func(r *faultRun) {
		r.hitsWhile(3, kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: r.group, Err: code})
	}
}

// fetchFault fails fetches of topic t with code for a while.
func fetchFault(code *kerr.Error) func(*faultRun) {
	return func(r *faultRun) {
		r.hitsWhile(3, kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Topic: "t", Err: code})
	}
}

// groupFault fails a group request of the member with code for a while.
func groupFault(key kmsg.Key, code *kerr.Error, n int) func(*faultRun) {
	return func(r *faultRun) {
		r.hitsWhile(n, kfake.Fault{Keys: []kmsg.Key{key}, Group: r.group, Err: code})
	}
}

// rejoinWith makes the member rejoin (a heartbeat answered
// REBALANCE_IN_PROGRESS) while req fails with code for a while.
func rejoinWith(key kmsg.Key, code *kerr.Error) func(*faultRun) {
	return func(r *faultRun) {
		r.hitsWhile(2,
			kfake.Fault{Keys: []kmsg.Key{key}, Group: r.group, Err: code},
			kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat}, Group: r.group, Err: kerr.RebalanceInProgress},
		)
	}
}

// slowFor delays the member's requests of key by 300 ms each, the first n
// of them, while records are produced.
func slowFor(key kmsg.Key, n int) func(*faultRun) {
	return func(r *faultRun) {
		var mu sync.Mutex
		slowed := 0
		r.tc.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
			mu.Lock()
			slowed++
			more := slowed < n
			mu.Unlock()
			if more {
				r.tc.KeepControl()
			}
			r.tc.SleepControl(func() { time.Sleep(300 * time.Millisecond) })
			return nil, nil, false
		})
		r.underLoad(4, func() {})
	}
}

// lostAndBack checks that the member lost its partitions and was assigned
// them again (a new assignment epoch).
func lostAndBack(r *faultRun) {
	for _, ps := range r.c.Stats().Partitions {
		if ps.Epoch > uint64(r.s.parts) {
			return
		}
	}
	r.t.Errorf("no partition was assigned again: %+v", r.c.Stats().Partitions)
}

// rejoined checks that the member joined the group again (a new
// generation); a cooperative member keeps its partitions meanwhile.
func rejoined(r *faultRun) {
	if _, gen := r.c.Client().GroupMetadata(); gen <= r.gen0 {
		r.t.Errorf("generation %d, %d before the fault: the member did not rejoin", gen, r.gen0)
	}
}

// The broker's faults, each on a kfake cluster while a member consumes a
// keyed stream (records failing once and, with a dead-letter topic, for
// good): for a while (or, for moves and restarts, a few times under load),
// then cleared. After each: the invariants of streamChecker hold (order,
// frontier, no loss, bounded memory), every frontier reaches the end offset
// on the broker (liveness: bounded here by a generous 30 s; the adapter's
// own bound is stated in the README), no partition stays paused, Close
// returns nil and Run nil, and no goroutine is left (TestMain's goleak).
func TestBrokerFaults(t *testing.T) {
	faults := []brokerFault{
		{name: "commit/COORDINATOR_NOT_AVAILABLE", inject: commitFault(kerr.CoordinatorNotAvailable)},
		{name: "commit/NOT_COORDINATOR", inject: commitFault(kerr.NotCoordinator)},
		{name: "commit/COORDINATOR_LOAD_IN_PROGRESS", inject: commitFault(kerr.CoordinatorLoadInProgress)},
		{name: "commit/REQUEST_TIMED_OUT", inject: commitFault(kerr.RequestTimedOut)},
		{name: "commit/REBALANCE_IN_PROGRESS", inject: commitFault(kerr.RebalanceInProgress)},
		{name: "commit/ILLEGAL_GENERATION", inject: commitFault(kerr.IllegalGeneration)},
		{name: "commit/UNKNOWN_MEMBER_ID", inject: commitFault(kerr.UnknownMemberID)},
		{name: "commit/FENCED_INSTANCE_ID", inject: commitFault(kerr.FencedInstanceID)},
		{name: "commit/OFFSET_METADATA_TOO_LARGE", inject: commitFault(kerr.OffsetMetadataTooLarge)},
		{name: "commit/UNKNOWN_SERVER_ERROR", inject: commitFault(kerr.UnknownServerError)},
		{name: "fetch/NOT_LEADER_FOR_PARTITION", inject: fetchFault(kerr.NotLeaderForPartition)},
		{name: "fetch/FENCED_LEADER_EPOCH", inject: fetchFault(kerr.FencedLeaderEpoch)},
		{name: "fetch/OFFSET_OUT_OF_RANGE", inject: fetchFault(kerr.OffsetOutOfRange)},
		{name: "fetch/UNKNOWN_SERVER_ERROR", inject: fetchFault(kerr.UnknownServerError)},
		{name: "fetch/slow", inject: slowFor(kmsg.Fetch, 4)},
		{name: "list-offsets/NOT_LEADER_FOR_PARTITION", atStart: true, inject: func(r *faultRun) {
			r.hitsWhile(2, kfake.Fault{Keys: []kmsg.Key{kmsg.ListOffsets}, Topic: "t", Err: kerr.NotLeaderForPartition})
		}},
		{name: "offset-fetch/COORDINATOR_LOAD_IN_PROGRESS", atStart: true, inject: groupFault(kmsg.OffsetFetch, kerr.CoordinatorLoadInProgress, 2)},
		{name: "offset-fetch/UNKNOWN_SERVER_ERROR", atStart: true, inject: groupFault(kmsg.OffsetFetch, kerr.UnknownServerError, 2)},
		{name: "heartbeat/UNKNOWN_MEMBER_ID", inject: groupFault(kmsg.Heartbeat, kerr.UnknownMemberID, 1), check: lostAndBack},
		{name: "heartbeat/REBALANCE_IN_PROGRESS", inject: groupFault(kmsg.Heartbeat, kerr.RebalanceInProgress, 2), check: rejoined},
		{name: "heartbeat/COORDINATOR_NOT_AVAILABLE", inject: groupFault(kmsg.Heartbeat, kerr.CoordinatorNotAvailable, 3)},
		{name: "heartbeat/failing-past-the-session-timeout", session: 500 * time.Millisecond, check: lostAndBack, inject: func(r *faultRun) {
			// The broker drops the member (no heartbeat got through for a
			// session); the member learns it when the fault clears
			// (UNKNOWN_MEMBER_ID), loses its partitions and rejoins.
			h := r.tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat}, Group: r.group, Err: kerr.CoordinatorNotAvailable, Count: -1})
			for range 10 { // three session timeouts
				r.s.produce(r.tc, 2)
				time.Sleep(150 * time.Millisecond)
			}
			if h.Hits() == 0 {
				r.t.Fatal("no heartbeat failed")
			}
			h.Remove()
		}},
		{name: "offset-fetch/slow", atStart: true, inject: func(r *faultRun) {
			r.tc.ControlKey(int16(kmsg.OffsetFetch), func(kmsg.Request) (kmsg.Response, error, bool) {
				r.tc.SleepControl(func() { time.Sleep(500 * time.Millisecond) })
				return nil, nil, false
			})
		}},
		{name: "heartbeat/slow", inject: slowFor(kmsg.Heartbeat, 3)},
		{name: "kip848-heartbeat/UNKNOWN_MEMBER_ID", kip848: true, inject: groupFault(kmsg.ConsumerGroupHeartbeat, kerr.UnknownMemberID, 1), check: lostAndBack},
		{name: "kip848-heartbeat/FENCED_MEMBER_EPOCH", kip848: true, inject: groupFault(kmsg.ConsumerGroupHeartbeat, kerr.FencedMemberEpoch, 1), check: lostAndBack},
		{name: "kip848-heartbeat/COORDINATOR_NOT_AVAILABLE", kip848: true, inject: groupFault(kmsg.ConsumerGroupHeartbeat, kerr.CoordinatorNotAvailable, 3)},
		{name: "kip848-commit/STALE_MEMBER_EPOCH", kip848: true, inject: commitFault(kerr.StaleMemberEpoch)},
		{name: "join-group/COORDINATOR_NOT_AVAILABLE", inject: rejoinWith(kmsg.JoinGroup, kerr.CoordinatorNotAvailable), check: rejoined},
		{name: "sync-group/UNKNOWN_SERVER_ERROR", inject: rejoinWith(kmsg.SyncGroup, kerr.UnknownServerError), check: rejoined},
		{name: "find-coordinator/COORDINATOR_NOT_AVAILABLE", brokers: 3, inject: func(r *faultRun) {
			// The coordinator moves (the old one answers NOT_COORDINATOR)
			// and finding the new one fails for a while.
			h := r.tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.FindCoordinator}, Group: r.group, Err: kerr.CoordinatorNotAvailable, Count: -1})
			for old := r.tc.CoordinatorFor(r.group); r.tc.CoordinatorFor(r.group) == old; {
				r.tc.RehashCoordinators()
			}
			eventually(r.t, "FindCoordinator failed twice", func() bool { r.s.produce(r.tc, 2); return h.Hits() >= 2 })
			h.Remove()
		}},
		{name: "dead-letter-produce/NOT_LEADER_FOR_PARTITION", dlq: true, inject: func(r *faultRun) {
			r.hitsWhile(2, kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "dlq", Err: kerr.NotLeaderForPartition})
		}},
		{name: "leaders-shuffled", brokers: 3, dlq: true, inject: func(r *faultRun) { r.underLoad(4, r.tc.ShufflePartitionLeaders) }},
		{name: "coordinator-moved", brokers: 3, inject: func(r *faultRun) { r.underLoad(4, r.tc.RehashCoordinators) }},
		{name: "partition-moved", brokers: 3, inject: func(r *faultRun) {
			n := int32(0)
			r.underLoad(4, func() {
				n++
				if err := r.tc.MoveTopicPartition("t", n%2, n%3); err != nil {
					r.t.Error(err)
				}
			})
		}},
		{name: "broker-removed-and-added", brokers: 3, inject: func(r *faultRun) {
			lead := r.tc.LeaderFor("t", 0)
			if err := r.tc.RemoveNode(lead); err != nil {
				r.t.Fatal(err)
			}
			r.underLoad(2, func() {})
			if _, _, err := r.tc.AddNode(-1, 0); err != nil {
				r.t.Fatal(err)
			}
			r.underLoad(2, func() {})
		}},
		{name: "cluster-restarted", inject: func(r *faultRun) { r.restart() }},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) { runBrokerFault(t, f) })
	}
}

func runBrokerFault(t *testing.T, f brokerFault) {
	const keys, parts, bound, poll = 6, 2, 16, 8
	brokers := max(f.brokers, 1)
	dir := t.TempDir()
	opts := []kfake.Opt{kfake.NumBrokers(brokers), kfake.SeedTopics(parts, "t", "dlq"),
		kfake.GroupMinSessionTimeout(50 * time.Millisecond), kip848Configs}
	if f.name == "cluster-restarted" {
		opts = append(opts, kfake.DataDir(dir))
	}
	kc, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	tc := &testCluster{Cluster: kc, addrs: kc.ListenAddrs()}
	t.Cleanup(func() { tc.Close() }) // after the member's Close (cleanups run last first)
	s := newStreamChecker(t, keys, parts)
	s.inFlightMx = bound + poll
	if f.dlq {
		s.permanent = func(i int) bool { return i%13 == 7 }
	}
	s.watch(tc)
	group := groupName(t)
	r := &faultRun{t: t, tc: tc, group: group, s: s}
	r.restart = func() {
		ports := make([]int, 0, len(tc.addrs))
		for _, a := range tc.addrs {
			_, ps, err := net.SplitHostPort(a)
			if err != nil {
				t.Fatal(err)
			}
			p, err := strconv.Atoi(ps)
			if err != nil {
				t.Fatal(err)
			}
			ports = append(ports, p)
		}
		tc.Close()
		time.Sleep(100 * time.Millisecond) // the member finds the brokers gone
		kc, err := kfake.NewCluster(append(opts, kfake.Ports(ports...))...)
		if err != nil {
			t.Fatal(err)
		}
		tc.Cluster = kc
		s.watch(tc)
		r.underLoad(2, func() {})
	}
	lb := &logBuffer{}
	defer func() {
		// KEYSCHED_KAFKA_FAULT_LOGS=1 shows what an operator would read.
		if t.Failed() || os.Getenv("KEYSCHED_KAFKA_FAULT_LOGS") != "" {
			t.Log(lb.String())
		}
	}()
	copts := append(tc.clientOpts(group, "t"), kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }),
		kgo.MetadataMinAge(10*time.Millisecond))
	if f.kip848 {
		copts = append(copts, protocolOpts(protoConsumer)...)
	}
	if f.session > 0 {
		copts = append(copts, kgo.SessionTimeout(f.session))
	}
	mopts := []Option{WithLogger(lb.logger()), WithCommitInterval(20 * time.Millisecond), WithRevokeTimeout(time.Second),
		WithMaxInFlight(bound), WithMaxPollRecords(poll), WithClientOptions(copts...),
		WithSchedulerOptions(keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}))}
	if f.dlq {
		mopts = append(mopts, WithDeadLetterTopic("dlq"))
	}
	s.produce(tc, 40)
	if f.atStart {
		done := make(chan struct{})
		go func() { defer close(done); f.inject(r) }()
		r.c = startFaultMember(t, s, mopts)
		<-done
	} else {
		r.c = startFaultMember(t, s, mopts)
		eventually(t, "the member at work", func() bool { return s.handledAny() })
		_, r.gen0 = r.c.Client().GroupMetadata()
		f.inject(r)
	}
	if t.Failed() {
		return
	}
	s.produce(tc, 20)
	deadline := time.Now().Add(30 * time.Second)
	for !s.allFinished() || !s.committedAtEnd(tc, group) {
		s.sample(r.c)
		if time.Now().After(deadline) {
			s.report()
			for p := range int32(parts) {
				t.Logf("partition %d: committed %d, end %d", p, tc.committedOffset(t, group, "t", p), tc.endOffset(t, "t", p))
			}
			t.Fatalf("every record finished and every frontier committed at the end offset: not within 30 s; stats %+v", r.c.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	eventually(t, "no partition paused", func() bool {
		for _, ps := range r.c.Stats().Partitions {
			if ps.Paused {
				return false
			}
		}
		return true
	})
	if f.check != nil {
		f.check(r)
	}
	s.report()
	if f.dlq {
		dead := tc.readAll(t, "dlq", s.permanents())
		if len(dead) < s.permanents() {
			t.Errorf("%d dead letters, want %d", len(dead), s.permanents())
		}
	}
}

// startFaultMember runs a member of the matrix, sampling its in-flight
// records; the test's cleanup closes it and wants nil from Close and Run.
func startFaultMember(t *testing.T, s *streamChecker, opts []Option) *Consumer {
	t.Helper()
	c, err := NewConsumer(s.handler, opts...)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tk := time.NewTicker(5 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				s.sample(c)
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-sampled
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil && !t.Failed() {
			t.Errorf("Close after the fault cleared: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return c
}

// A fetch the broker keeps refusing (UNKNOWN_SERVER_ERROR, which franz-go
// hands to the poll at once, without a backoff) does not make the poll
// loop spin: it backs off (10 ms doubling to 250 ms) while polls bring
// only errors. Input that broke it: partition 1 of 2 refusing every Fetch
// for a second: 4,717 Fetch requests reached the broker, a core busy.
func TestFetchFaultDoesNotSpinThePollLoop(t *testing.T) {
	tc := newCluster(t, 2, "t")
	group := groupName(t)
	logs := &logBuffer{}
	c := startConsumer(t, func(context.Context, *kgo.Record) error { return nil }, WithLogger(logs.logger()),
		WithCommitInterval(20*time.Millisecond), WithClientOptions(tc.clientOpts(group, "t")...))
	tc.produce(t, rec("t", 0, "a", "0"), rec("t", 1, "b", "1"))
	eventually(t, "both records handled", func() bool { return c.Stats().Finished == 2 })
	f := tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Partitions: []int32{1}, Err: kerr.UnknownServerError, Count: -1})
	time.Sleep(time.Second)
	t.Logf("%d refused Fetch requests in one second", f.Hits())
	if n := f.Hits(); n > 200 {
		t.Errorf("%d refused Fetch requests in one second, want at most 200 (a backoff)", n)
	}
	f.Remove()
	tc.produce(t, rec("t", 1, "b", "2"), rec("t", 0, "a", "3"))
	eventually(t, "the records after the fault handled", func() bool { return c.Stats().Finished == 4 })
	eventually(t, "one recovery line", func() bool { return strings.Contains(logs.String(), "fetch recovered") })
}
