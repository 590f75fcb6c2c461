package kafka

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreCurrent(),
		// kfake's run loop, resuming a slept control (SleepControl) as the
		// cluster closes, can wait for ever on the control mutex that the
		// exiting control goroutine held: Close does not wait for run.
		// The fake's goroutine, not the consumer's (CI, 2026-12-01).
		goleak.IgnoreAnyFunction("github.com/twmb/franz-go/pkg/kfake.(*Cluster).continueSleptControl"))
}

// testCluster is an in-process kfake cluster.
type testCluster struct {
	*kfake.Cluster
	addrs []string
}

func newCluster(t *testing.T, partitions int32, topics ...string) *testCluster {
	t.Helper()
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, topics...),
		kfake.GroupMinSessionTimeout(50*time.Millisecond),
		kip848Configs,
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &testCluster{Cluster: c, addrs: c.ListenAddrs()}
}

// clientOpts are a test member's franz-go options: small timeouts so that
// joins and rebalances take milliseconds.
func (tc *testCluster) clientOpts(group string, topics ...string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(tc.addrs...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topics...),
		kgo.SessionTimeout(3 * time.Second),
		kgo.HeartbeatInterval(50 * time.Millisecond),
		kgo.RebalanceTimeout(10 * time.Second),
		kgo.FetchMaxWait(50 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}
}

// produced is what the test producer wrote.
type produced struct {
	Topic     string
	Partition int32
	Key       []byte
	Offset    int64
}

// produce writes records and returns where they landed. Records go to the
// partition set in them (manual partitioner).
func (tc *testCluster) produce(t *testing.T, rs ...*kgo.Record) []produced {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tc.addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	res := cl.ProduceSync(context.Background(), rs...)
	if err := res.FirstErr(); err != nil {
		t.Fatal(err)
	}
	out := make([]produced, len(res))
	for i, r := range res {
		out[i] = produced{r.Record.Topic, r.Record.Partition, r.Record.Key, r.Record.Offset}
	}
	return out
}

// readAll reads every record of topic from the start (no group).
func (tc *testCluster) readAll(t *testing.T, topic string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tc.addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s", len(out), want, topic)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

// commitLog observes OffsetCommit requests: (member, topic, partition) ->
// the offsets committed, in order.
type commitLog struct {
	mu      sync.Mutex
	commits []commitSeen
}

type commitSeen struct {
	Member    string
	Topic     string
	Partition int32
	Offset    int64
	Metadata  string
}

// topicNames maps topic IDs to names.
func (tc *testCluster) topicNames(t *testing.T) map[[16]byte]string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tc.addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	resp, err := kmsg.NewPtrMetadataRequest().RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	names := map[[16]byte]string{}
	for _, tp := range resp.Topics {
		if tp.Topic != nil {
			names[tp.TopicID] = *tp.Topic
		}
	}
	return names
}

func (tc *testCluster) watchCommits(t *testing.T) *commitLog {
	names := tc.topicNames(t)
	l := &commitLog{}
	tc.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		tc.KeepControl()
		r := req.(*kmsg.OffsetCommitRequest)
		l.mu.Lock()
		for _, t := range r.Topics {
			topic := t.Topic
			if topic == "" {
				topic = names[t.TopicID]
			}
			for _, p := range t.Partitions {
				m := ""
				if p.Metadata != nil {
					m = *p.Metadata
				}
				l.commits = append(l.commits, commitSeen{r.MemberID, topic, p.Partition, p.Offset, m})
			}
		}
		l.mu.Unlock()
		return nil, nil, false
	})
	return l
}

func (l *commitLog) of(topic string, part int32) []commitSeen {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []commitSeen
	for _, c := range l.commits {
		if c.Topic == topic && c.Partition == part {
			out = append(out, c)
		}
	}
	return out
}

// eventually polls cond until it holds or 20 s pass (a generous bound for a
// loaded machine: it never decides a result, only gives up).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, 20*time.Second, what, cond)
}

// eventuallyWithin is eventually with a bound of d.
func eventuallyWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startConsumer makes and runs a consumer; the test's cleanup closes it.
func startConsumer(t *testing.T, h Handler, opts ...Option) *Consumer {
	t.Helper()
	c, err := NewConsumer(h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	t.Cleanup(func() {
		// Short: tests that leave a handler stuck check nothing here.
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_ = c.Close(ctx)
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return c
}

func (c *Consumer) partStats(topic string, part int32) (PartitionStats, bool) {
	for _, ps := range c.Stats().Partitions {
		if ps.Topic == topic && ps.Partition == part {
			return ps, true
		}
	}
	return PartitionStats{}, false
}

// logBuffer is a slog handler's output, safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

var quiet = slog.New(slog.DiscardHandler)

var groupSeq atomic.Int64

func groupName(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), groupSeq.Add(1))
}

func rec(topic string, part int32, key string, value string) *kgo.Record {
	r := &kgo.Record{Topic: topic, Partition: part, Value: []byte(value)}
	if key != "\x00nil" {
		r.Key = []byte(key)
	}
	return r
}

// endOffset returns a partition's log end offset.
func (tc *testCluster) endOffset(t *testing.T, topic string, part int32) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tc.addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition, rp.Timestamp = part, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Topics[0].Partitions[0].Offset
}

// A group protocol franz-go speaks, for tests that run under each.
type groupProtocol string

const (
	protoEager       groupProtocol = "classic-eager"       // the classic protocol, RangeBalancer (eager: every rebalance revokes everything)
	protoCooperative groupProtocol = "classic-cooperative" // the classic protocol, CooperativeStickyBalancer (franz-go's default)
	protoConsumer    groupProtocol = "kip848-consumer"     // KIP-848: the broker assigns (ConsumerGroupHeartbeat)
)

var groupProtocols = []groupProtocol{protoEager, protoCooperative, protoConsumer}

// protocolOpts are the client options that select p.
func protocolOpts(p groupProtocol) []kgo.Opt {
	switch p {
	case protoEager:
		return []kgo.Opt{kgo.Balancers(kgo.RangeBalancer())}
	case protoConsumer:
		return []kgo.Opt{kgo.Balancers(kgo.RangeBalancer()), kgo.ServerSideBalancer()}
	}
	return []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer())}
}

// kip848Configs give KIP-848 groups the classic test groups' pace: a
// heartbeat every 50 ms (the broker sets it under KIP-848), a 3 s session.
var kip848Configs = kfake.BrokerConfigs(map[string]string{
	"group.consumer.heartbeat.interval.ms": "50",
	"group.consumer.session.timeout.ms":    "1000",
})

// clientOptsFor is clientOpts with the group protocol p.
func (tc *testCluster) clientOptsFor(p groupProtocol, group string, topics ...string) []kgo.Opt {
	return append(tc.clientOpts(group, topics...), protocolOpts(p)...)
}

// expectProtocol observes the group's requests and returns a check that
// the members spoke p: KIP-848 heartbeats and no JoinGroup, or JoinGroups
// offering only p's balancer ("range" eager, "cooperative-sticky").
func (tc *testCluster) expectProtocol(t *testing.T, group string, p groupProtocol) func() {
	want := map[groupProtocol]string{protoEager: "range", protoCooperative: "cooperative-sticky"}[p]
	var mu sync.Mutex
	var offered []string
	joins := tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.JoinGroup}, Group: group, Observe: true, Count: -1, When: func(req kmsg.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, pr := range req.(*kmsg.JoinGroupRequest).Protocols {
			offered = append(offered, pr.Name)
		}
		return true
	}})
	hbs := tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.ConsumerGroupHeartbeat}, Group: group, Observe: true, Count: -1})
	return func() {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if p == protoConsumer {
			if hbs.Hits() == 0 || joins.Hits() > 0 {
				t.Errorf("%s: %d ConsumerGroupHeartbeats, %d JoinGroups", p, hbs.Hits(), joins.Hits())
			}
			return
		}
		if joins.Hits() == 0 || hbs.Hits() > 0 {
			t.Errorf("%s: %d JoinGroups, %d ConsumerGroupHeartbeats", p, joins.Hits(), hbs.Hits())
		}
		for _, o := range offered {
			if o != want {
				t.Errorf("%s: a member offered the %q balancer", p, o)
			}
		}
	}
}

// How inTxn's function ends its transaction.
type txnEnd int

const (
	txnCommit txnEnd = iota
	txnAbort
	txnOpen // left open
)

// inTxn returns a function that writes rs to the cluster in one transaction
// of a transactional producer (one for the test, id dlq-writer) and ends it
// as end says.
func (tc *testCluster) inTxn(t *testing.T) func(end txnEnd, rs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tc.addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.TransactionalID("dlq-writer"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return func(end txnEnd, rs ...*kgo.Record) {
		t.Helper()
		ctx := context.Background()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if end != txnOpen {
			if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(end == txnCommit)); err != nil {
				t.Fatal(err)
			}
		}
	}
}
