package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/kafka"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A consumer on an in-process kfake cluster: records of one key run in
// offset order, keys run concurrently, failed records are retried and then
// dead-lettered, and Close drains, commits and leaves the group.
func ExampleNewConsumer() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders", "orders.dlq"),
		kfake.GroupMinSessionTimeout(50*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	seeds := cluster.ListenAddrs()

	producer, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		log.Fatal(err)
	}
	for i := range 6 {
		key := fmt.Sprintf("customer-%d", i%2)
		r := &kgo.Record{Key: []byte(key), Value: fmt.Appendf(nil, "%s/order-%d", key, i)}
		if err := producer.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			log.Fatal(err)
		}
	}
	producer.Close()

	var mu sync.Mutex
	var handled []string
	done := make(chan struct{})
	c, err := kafka.NewConsumer(func(ctx context.Context, r *kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, string(r.Value))
		if len(handled) == 6 {
			close(done)
		}
		return nil // idempotent work here: the record may be handled again after a crash
	},
		kafka.WithClientOptions(
			kgo.SeedBrokers(seeds...),
			kgo.ConsumerGroup("billing"),
			kgo.ConsumeTopics("orders"),
			kgo.SessionTimeout(time.Second),
			kgo.HeartbeatInterval(100*time.Millisecond),
			kgo.FetchMaxWait(50*time.Millisecond),
		),
		kafka.WithSchedulerOptions(
			keysched.WithWorkers(16),
			keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond}),
		),
		kafka.WithDeadLetterTopic("orders.dlq"),
		kafka.WithMaxInFlight(1000),
		kafka.WithCommitInterval(time.Second),
		kafka.WithLogger(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := c.Run(context.Background()); err != nil {
			log.Print(err)
		}
	}()
	<-done
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		log.Fatal(err)
	}
	mu.Lock()
	slices.Sort(handled)
	fmt.Println(handled)
	mu.Unlock()
	// Output: [customer-0/order-0 customer-0/order-2 customer-0/order-4 customer-1/order-1 customer-1/order-3 customer-1/order-5]
}

// With the Park failure policy a key stops on a record that failed for
// good; an operator (or code) lists the parked keys and resumes or skips
// them. Skip dead-letters the record and moves the key on; the key's later
// records waited behind it, in order, and the other keys never stopped.
func ExampleConsumer_Parked() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "payments", "payments.dlq"),
		kfake.GroupMinSessionTimeout(50*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	seeds := cluster.ListenAddrs()
	producer, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic("payments"))
	if err != nil {
		log.Fatal(err)
	}
	for _, v := range []string{"acct-1 bad", "acct-2 ok", "acct-1 ok"} {
		r := &kgo.Record{Key: []byte(v[:6]), Value: []byte(v)}
		if err := producer.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			log.Fatal(err)
		}
	}
	producer.Close()

	handled := make(chan string, 3)
	c, err := kafka.NewConsumer(func(ctx context.Context, r *kgo.Record) error {
		if string(r.Value) == "acct-1 bad" {
			return errors.New("downstream refuses it")
		}
		handled <- string(r.Value)
		return nil
	},
		kafka.WithClientOptions(kgo.SeedBrokers(seeds...), kgo.ConsumerGroup("ledger"),
			kgo.ConsumeTopics("payments"), kgo.FetchMaxWait(50*time.Millisecond)),
		kafka.WithSchedulerOptions(
			keysched.WithFailurePolicy(keysched.Park),
			keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}),
		),
		kafka.WithDeadLetterTopic("payments.dlq"),
		kafka.WithLogger(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())
	go c.Run(context.Background())

	fmt.Println("handled:", <-handled) // acct-2 goes on while acct-1 is stuck
	var parked []kafka.ParkedKey
	for len(parked) == 0 {
		time.Sleep(10 * time.Millisecond) // an operator's page would poll like this
		parked = c.Parked()
	}
	for _, k := range parked {
		fmt.Printf("parked: key %s at offset %d after %d attempts: %v\n", k.Key, k.Offset, k.Attempts, k.Err)
		if err := c.Skip(k); err != nil { // or c.Resume(k) once the cause is fixed
			log.Fatal(err)
		}
	}
	fmt.Println("handled:", <-handled)
	// Output:
	// handled: acct-2 ok
	// parked: key acct-1 at offset 0 after 2 attempts: downstream refuses it
	// handled: acct-1 ok
}

// Stats is cheap: poll it for metrics. Partitions lists only the partitions
// owned now. (Compiled, not run: it needs a running consumer.)
func ExampleConsumer_Stats() {
	var c *kafka.Consumer // from NewConsumer
	if c == nil {
		return
	}
	st := c.Stats()
	for _, p := range st.Partitions {
		fmt.Printf("%s %s/%d committed=%d frontier=%d in_flight=%d paused=%v lag=%d\n",
			st.Group, p.Topic, p.Partition, p.Committed, p.Frontier, p.InFlight, p.Paused, p.Lag)
	}
}
