package outbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// Write an event in the same transaction as the state change it reports,
// then publish it with a relay. SQLite in a temporary directory: no setup.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, err := sqldb.OpenSQLite(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)`); err != nil {
		panic(err)
	}
	ob, err := outbox.New(db)
	if err != nil {
		panic(err)
	}
	if err := ob.CreateSchema(ctx); err != nil { // explicit, idempotent
		panic(err)
	}

	// The state change and its event commit together, or not at all.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	if _, err := tx.Exec(`INSERT INTO accounts (id, balance) VALUES ('acct-1', 100)`); err != nil {
		panic(err)
	}
	for _, p := range []string{"opened", "deposited 100"} {
		if _, err := ob.Write(ctx, tx, outbox.Event{Key: "acct-1", Type: "account", Payload: []byte(p)}); err != nil {
			panic(err)
		}
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}

	// The relay publishes each key's events in order, at least once.
	done := make(chan struct{})
	n := 0
	relay, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		fmt.Printf("publish %s %s: %s\n", e.Key, e.Type, e.Payload)
		if n++; n == 2 {
			close(done)
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	go relay.Run(ctx)
	<-done
	if err := relay.Close(ctx); err != nil { // marks what was published, releases its leases
		panic(err)
	}
	left, _ := ob.Count(ctx)
	fmt.Println("rows left:", len(left))
	// Output:
	// publish acct-1 account: opened
	// publish acct-1 account: deposited 100
	// rows left: 0
}
