package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/sqldb"
)

// An idempotent consumer: the event's effect and its ID commit together, so
// a redelivery is recognised and changes nothing.
func ExampleInbox_Apply() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db, err := sqldb.OpenSQLite(filepath.Join(dir, "consumer.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE balances (account TEXT PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
		panic(err)
	}
	in, err := inbox.New(db)
	if err != nil {
		panic(err)
	}
	if err := in.CreateSchema(ctx); err != nil {
		panic(err)
	}
	deposit := func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO balances VALUES ('acct-1', 100)
			ON CONFLICT (account) DO UPDATE SET amount = amount + 100`)
		return err
	}
	for range 3 { // the broker delivers event "evt-1" three times
		applied, err := in.Apply(ctx, "evt-1", deposit)
		fmt.Println("applied:", applied, "err:", err)
	}
	var amount int
	_ = db.QueryRow(`SELECT amount FROM balances WHERE account = 'acct-1'`).Scan(&amount)
	fmt.Println("balance:", amount)
	// Output:
	// applied: true err: <nil>
	// applied: false err: <nil>
	// applied: false err: <nil>
	// balance: 100
}

// A version gate: a snapshot of an entity is written only when it is newer
// than the stored one, so a duplicate or an older snapshot arriving late
// changes nothing, with no table of event IDs.
func ExampleVersions_Apply() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "versions-example")
	defer os.RemoveAll(dir)
	db, err := sqldb.OpenSQLite(filepath.Join(dir, "consumer.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT NOT NULL)`); err != nil {
		panic(err)
	}
	v, err := inbox.NewVersions(db)
	if err != nil {
		panic(err)
	}
	if err := v.CreateSchema(ctx); err != nil {
		panic(err)
	}
	for _, ev := range []struct {
		version int64
		status  string
	}{{1, "placed"}, {3, "shipped"}, {2, "paid"}, {3, "shipped"}} { // out of order, and a duplicate
		applied, err := v.Apply(ctx, "order-7", ev.version, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES ('order-7', ?)
				ON CONFLICT (id) DO UPDATE SET status = excluded.status`, ev.status)
			return err
		})
		fmt.Println(ev.version, ev.status, "applied:", applied, err)
	}
	var status string
	_ = db.QueryRow(`SELECT status FROM orders WHERE id = 'order-7'`).Scan(&status)
	fmt.Println("status:", status)
	// Output:
	// 1 placed applied: true <nil>
	// 3 shipped applied: true <nil>
	// 2 paid applied: false <nil>
	// 3 shipped applied: false <nil>
	// status: shipped
}
