package kafka

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keysched/keysched/internal/opttest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A dead-letter topic name Kafka would refuse (its rule: 1 to 249 of
// [a-zA-Z0-9._-], not "." or "..") is refused by WithDeadLetterTopic, before
// any record fails; the names Kafka accepts pass. No cluster is needed.
func TestDeadLetterTopicNameKafkaRefusesIsRefused(t *testing.T) {
	h := func(context.Context, *kgo.Record) error { return nil }
	client := WithClientOptions(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("orders"))
	for _, name := range []string{"bad name!", ".", "..", "orders/dlq", "orders:dlq", "dlq\n", "é", strings.Repeat("a", 250)} {
		c, err := NewConsumer(h, client, WithDeadLetterTopic(name))
		if c != nil {
			t.Errorf("%q: a consumer came back", name)
			_ = c.Close(context.Background())
		}
		if p := opttest.Problem(err, opttest.Want{Option: "WithDeadLetterTopic", Prefix: "kafka: invalid option: ", Sentinels: []error{ErrInvalidOption}}); p != "" {
			t.Errorf("%q: %s", name, p)
		}
	}
	for _, name := range []string{"orders.dlq", "orders.dql", "A-b_c.9", "...", "_", strings.Repeat("a", 249)} {
		c, err := NewConsumer(h, client, WithDeadLetterTopic(name))
		if err != nil {
			t.Errorf("%q refused: %v", name, err)
			continue
		}
		_ = c.Close(context.Background())
	}
}

// A dead-letter topic the cluster does not have (a typo) makes Run return an
// error naming it at once, wrapping ErrUnknownTopic, instead of a dead-letter
// produce failing for ever when the first record fails for good; the check
// creates nothing. With kgo.AllowAutoTopicCreation the check is skipped: the
// first dead letter creates the topic, and once it exists a consumer without
// the option runs.
func TestRunRefusesADeadLetterTopicTheClusterLacks(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"),
		kfake.GroupMinSessionTimeout(50*time.Millisecond), kfake.AllowAutoTopicCreation(), kip848Configs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	tc := &testCluster{Cluster: kc, addrs: kc.ListenAddrs()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	c, err := NewConsumer(failBadForGood, WithLogger(quiet), WithDeadLetterTopic("orders.dql"),
		WithClientOptions(tc.clientOpts(groupName(t), "orders")...))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(ctx)
	if !errors.Is(err, ErrUnknownTopic) || !strings.HasPrefix(err.Error(), `kafka: unknown topic or partition: dead-letter topic "orders.dql" (WithDeadLetterTopic)`) {
		t.Errorf("Run with a dead-letter topic the cluster lacks: %v, want ErrUnknownTopic naming it", err)
	}
	if err := c.Close(ctx); err != nil {
		t.Errorf("Close after Run refused the topic: %v", err)
	}
	if ts := tc.topicNames(t); len(ts) != 1 {
		t.Errorf("the check created topics: %v", ts)
	}

	// Auto topic creation allowed: Run runs, and the first dead letter
	// creates the topic.
	tc.produce(t, rec("orders", 0, "k", "bad"))
	c, runDone := tc.runConsumer(t, groupName(t), failBadForGood, WithLogger(quiet), WithDeadLetterTopic("orders.dql"),
		WithClientOptions(kgo.ConsumeTopics("orders"), kgo.AllowAutoTopicCreation()))
	tc.readAll(t, "orders.dql", 1)
	if err := c.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	runReturnsNil(t, runDone)

	// The topic exists now: a consumer without auto topic creation runs
	// (a group of its own: it reads the bad record again and dead-letters
	// it, a second dead letter). Owning the partition would not show it:
	// the client joins the group before Run starts.
	c, runDone = tc.runConsumer(t, groupName(t), failBadForGood, WithLogger(quiet), WithDeadLetterTopic("orders.dql"),
		WithClientOptions(kgo.ConsumeTopics("orders")))
	tc.readAll(t, "orders.dql", 2)
	if err := c.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	runReturnsNil(t, runDone)
}

// Close ends a Run whose dead-letter topic check the cluster does not
// answer: Run returns nil, Close within its bound.
func TestCloseEndsRunWhileItChecksTheDeadLetterTopic(t *testing.T) {
	tc := newCluster(t, 1, "orders", "orders.dlq")
	release := make(chan struct{})
	defer close(release)
	held := make(chan struct{}, 1)
	tc.holdRequests(kmsg.Metadata, release, func() {
		select {
		case held <- struct{}{}:
		default:
		}
	})
	c, runDone := tc.runConsumer(t, groupName(t), handleAll, WithDeadLetterTopic("orders.dlq"),
		WithClientOptions(kgo.ConsumeTopics("orders")))
	<-held
	eventually(t, "Run started", func() bool { return c.running.Load() })
	_ = closeWithinMargin(t, c, 100*time.Millisecond)
	runReturnsNil(t, runDone)
}

// A dead-letter topic created just before Run, not yet in the metadata of
// the broker Run asks (it answers UNKNOWN_TOPIC_OR_PARTITION meanwhile), is
// asked about again: Run goes on once the topic shows, and the first
// record that fails for good is dead-lettered into it. Here the topic is
// created right after the cluster's first answer that it does not exist.
func TestRunAsksAgainForADeadLetterTopicNotYetKnown(t *testing.T) {
	tc := newCluster(t, 1, "orders")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	unknown := make(chan struct{}, 1)
	asked := 0
	tc.ControlKey(int16(kmsg.Metadata), func(req kmsg.Request) (kmsg.Response, error, bool) {
		tc.KeepControl()
		m := req.(*kmsg.MetadataRequest)
		if len(m.Topics) == 1 && m.Topics[0].Topic != nil && *m.Topics[0].Topic == "late.dlq" {
			if asked++; asked == 1 {
				unknown <- struct{}{} // answered below, by the cluster: not known yet
			}
		}
		return nil, nil, false
	})
	tc.produce(t, rec("orders", 0, "k", "bad"))
	c, runDone := tc.runConsumer(t, groupName(t), failBadForGood, WithLogger(quiet), WithDeadLetterTopic("late.dlq"),
		WithClientOptions(kgo.ConsumeTopics("orders")))
	select {
	case <-unknown:
	case err := <-runDone:
		t.Fatalf("Run returned before asking about the dead-letter topic: %v", err)
	case <-ctx.Done():
		t.Fatal("Run never asked about the dead-letter topic")
	}
	// The cluster handles requests one at a time: this creation comes
	// after its answer to the first question.
	admin, err := kgo.NewClient(kgo.SeedBrokers(tc.addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	create := kmsg.NewPtrCreateTopicsRequest()
	ct := kmsg.NewCreateTopicsRequestTopic()
	ct.Topic, ct.NumPartitions, ct.ReplicationFactor = "late.dlq", 1, 1
	create.Topics = append(create.Topics, ct)
	if resp, err := create.RequestWith(ctx, admin); err != nil || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("create late.dlq: %v %+v", err, resp)
	}
	select {
	case err := <-runDone:
		t.Fatalf("Run gave up on a topic created meanwhile: %v", err)
	default:
	}
	tc.readAll(t, "late.dlq", 1)
	if err := c.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	runReturnsNil(t, runDone)
}
