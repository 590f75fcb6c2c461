package kafka_test

import (
	"context"
	"log"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"

	"github.com/keysched/keysched/kafka"
)

// WithMeterProvider reports the consumer to an OpenTelemetry MeterProvider
// (here the global one, which the program's SDK set up): the messaging
// conventions' consumed count and process duration, per-partition lag,
// committed offset, frontier, in flight and paused (only for the partitions
// owned now), and the scheduler's instruments. (Compiled, not run: it needs
// a broker; ExampleNewConsumer runs on an in-process one.)
func ExampleWithMeterProvider() {
	c, err := kafka.NewConsumer(func(ctx context.Context, r *kgo.Record) error { return nil },
		kafka.WithClientOptions(kgo.SeedBrokers("localhost:9092"), kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders")),
		kafka.WithMeterProvider(otel.GetMeterProvider(), attribute.String("service", "billing")),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())
	go c.Run(context.Background())
}
