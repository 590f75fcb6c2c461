package kafkasink_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/outbox/kafkasink"
	"github.com/keysched/keysched/db/sqldb"
)

// Relay outbox events to Kafka (here franz-go's in-process kfake cluster).
func Example() {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "accounts"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		panic(err)
	}
	defer producer.Close()

	dir, _ := os.MkdirTemp("", "kafkasink-example")
	defer os.RemoveAll(dir)
	db, err := sqldb.OpenSQLite(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ob, _ := outbox.New(db)
	if err := ob.CreateSchema(ctx); err != nil {
		panic(err)
	}
	tx, _ := db.BeginTx(ctx, nil)
	for _, p := range []string{"opened", "deposited 100"} {
		if _, err := ob.Write(ctx, tx, outbox.Event{Key: "acct-1", Type: "account", Payload: []byte(p)}); err != nil {
			panic(err)
		}
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}

	sink, err := kafkasink.New(producer, "accounts")
	if err != nil {
		panic(err)
	}
	relay, err := ob.NewRelay(sink)
	if err != nil {
		panic(err)
	}
	go relay.Run(ctx)
	defer relay.Close(ctx)

	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("accounts"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		panic(err)
	}
	defer consumer.Close()
	for n := 0; n < 2; {
		consumer.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			fmt.Printf("%s: %s\n", r.Key, r.Value)
			n++
		})
	}
	// Output:
	// acct-1: opened
	// acct-1: deposited 100
}
