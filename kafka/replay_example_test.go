package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/keysched/keysched/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Replay the last two hours' dead letters of orders that failed on a
// timeout, after a dry run.
func ExampleReplay() {
	ctx := context.Background()
	o := kafka.ReplayOptions{
		DeadLetterTopic: "orders.dlq",
		Topics:          []string{"orders"},
		ErrorContains:   "timeout",
		Since:           time.Now().Add(-2 * time.Hour),
		DryRun:          true,
	}
	rep, err := kafka.Replay(ctx, o, kgo.SeedBrokers("localhost:9092"))
	var refused *kafka.ReplayRefusedError
	switch {
	case errors.As(err, &refused):
		for _, p := range refused.Problems {
			log.Printf("%s: %v", p.At, p.Err) // nothing was written
		}
		return
	case err != nil:
		log.Fatal(err)
	}
	for _, r := range rep.Records {
		fmt.Printf("would replay %s/%d@%d: %s\n", r.DeadLetter.Topic, r.DeadLetter.Partition, r.DeadLetter.Offset, r.DeadLetter.Error)
	}
	o.DryRun = false
	if rep, err = kafka.Replay(ctx, o, kgo.SeedBrokers("localhost:9092")); err != nil {
		log.Fatal(err) // rep.Records say which were written (Written) and which not (Err)
	}
	fmt.Println("written:", rep.Written)
}
