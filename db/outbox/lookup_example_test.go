package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// An operator asks what happened to one event: pending (with what is ahead
// of it on its key), then, once the relay has published it with the default
// retention, not found (a sent row is deleted).
func ExampleOutbox_Lookup() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-lookup")
	defer os.RemoveAll(dir)
	db, err := sqldb.OpenSQLite(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ob, err := outbox.New(db)
	if err != nil {
		panic(err)
	}
	if err := ob.CreateSchema(ctx); err != nil {
		panic(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	for _, id := range []string{"order-1-created", "order-1-paid"} {
		if _, err := ob.Write(ctx, tx, outbox.Event{ID: id, Key: "order-1", Type: "order"}); err != nil {
			panic(err)
		}
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}

	s, err := ob.Lookup(ctx, "order-1-paid")
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s: %v, key %s, %d ahead\n", s.ID, s.State, s.Key, s.Ahead)

	published := make(chan struct{})
	relay, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		if e.ID == "order-1-paid" {
			close(published)
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	go relay.Run(ctx)
	<-published
	if err := relay.Close(ctx); err != nil { // marks what was published
		panic(err)
	}
	_, err = ob.Lookup(ctx, "order-1-paid")
	fmt.Println(errors.Is(err, outbox.ErrNotFound))
	// Output:
	// order-1-paid: pending, key order-1, 1 ahead
	// true
}
