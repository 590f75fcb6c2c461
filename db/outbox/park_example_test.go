package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/bus"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// exampleOutbox opens a SQLite outbox in a temporary directory and writes
// one event per payload on key "acct-1", with IDs evt-1, evt-2...
func exampleOutbox(ctx context.Context, payloads ...string) (ob *outbox.Outbox, cleanup func()) {
	dir, _ := os.MkdirTemp("", "outbox-example")
	db, err := sqldb.OpenSQLite(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	if ob, err = outbox.New(db); err != nil {
		panic(err)
	}
	if err := ob.CreateSchema(ctx); err != nil {
		panic(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	for i, p := range payloads {
		e := outbox.Event{ID: "evt-" + strconv.Itoa(i+1), Key: "acct-1", Type: "account", Payload: []byte(p)}
		if _, err := ob.Write(ctx, tx, e); err != nil {
			panic(err)
		}
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
	return ob, func() { db.Close(); os.RemoveAll(dir) }
}

// Under the Park policy a row that fails for good is marked dead and stops
// its key, for every relay, until an operator resumes it (publish it again,
// then the rest) or skips it.
func ExampleRelay_Resume() {
	ctx := context.Background()
	ob, cleanup := exampleOutbox(ctx, "opened", "deposited 100", "withdrew 30")
	defer cleanup()

	var broken atomic.Bool // the downstream rejects "deposited 100" until fixed
	broken.Store(true)
	published := make(chan string, 10)
	died := make(chan outbox.DeadEvent, 1)
	relay, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		if string(e.Payload) == "deposited 100" && broken.Load() {
			return keysched.Permanent(errors.New("schema mismatch")) // no retry
		}
		published <- string(e.Payload)
		return nil
	}, outbox.WithFailurePolicy(keysched.Park), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithOnDead(func(d outbox.DeadEvent) { died <- d }))
	if err != nil {
		panic(err)
	}
	go relay.Run(ctx)

	fmt.Println("published:", <-published)
	d := <-died
	fmt.Printf("dead: %s %q after %d attempt(s): %s\n", d.ID, d.Payload, d.Attempts, d.Err)
	parked, _ := relay.Parked(ctx)
	fmt.Println("parked keys:", parked)

	broken.Store(false) // the downstream is fixed: publish the dead row again, then the rest
	if err := relay.Resume(ctx, "acct-1"); err != nil {
		panic(err)
	}
	fmt.Println("published:", <-published)
	fmt.Println("published:", <-published)
	if err := relay.Resume(ctx, "acct-1"); errors.Is(err, outbox.ErrNotParked) {
		fmt.Println("resume again:", err)
	}
	if err := relay.Close(ctx); err != nil {
		panic(err)
	}
	// Output:
	// published: opened
	// dead: evt-2 "deposited 100" after 1 attempt(s): schema mismatch
	// parked keys: [acct-1]
	// published: deposited 100
	// published: withdrew 30
	// resume again: outbox: key has no dead row: "acct-1"
}

// SkipHead gives up a parked key's dead row for good and names it; the key
// goes on with its next row. The Outbox's Resume, Skip and SkipHead need no
// relay: an operator's tool can call them while the relays run elsewhere.
func ExampleOutbox_SkipHead() {
	ctx := context.Background()
	ob, cleanup := exampleOutbox(ctx, "opened", "garbled", "deposited 100")
	defer cleanup()

	published := make(chan string, 10)
	died := make(chan struct{}, 1)
	relay, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		if string(e.Payload) == "garbled" {
			return keysched.Permanent(errors.New("cannot encode"))
		}
		published <- string(e.Payload)
		return nil
	}, outbox.WithFailurePolicy(keysched.Park), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithOnDead(func(outbox.DeadEvent) { died <- struct{}{} }))
	if err != nil {
		panic(err)
	}
	go relay.Run(ctx)
	fmt.Println("published:", <-published)
	<-died

	id, err := ob.SkipHead(ctx, "acct-1") // the relay polls, sees the key free again
	if err != nil {
		panic(err)
	}
	fmt.Println("skipped:", id)
	fmt.Println("published:", <-published)
	if err := relay.Close(ctx); err != nil {
		panic(err)
	}
	counts, _ := ob.Count(ctx)
	fmt.Println("skipped rows kept:", counts[outbox.Skipped])
	// Output:
	// published: opened
	// skipped: evt-2
	// published: deposited 100
	// skipped rows kept: 1
}

// SkipEvent is the operator's Skip: it gives up the key's dead head only if
// it is the event the operator looked at. A stale view (here an ID that is
// not the head) is refused with the head as it is now, and nothing moves.
func ExampleOutbox_SkipEvent() {
	ctx := context.Background()
	ob, cleanup := exampleOutbox(ctx, "opened", "garbled", "deposited 100")
	defer cleanup()

	published := make(chan string, 10)
	died := make(chan struct{}, 1)
	relay, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		if string(e.Payload) == "garbled" {
			return keysched.Permanent(errors.New("cannot encode"))
		}
		published <- string(e.Payload)
		return nil
	}, outbox.WithFailurePolicy(keysched.Park), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithOnDead(func(outbox.DeadEvent) { died <- struct{}{} }))
	if err != nil {
		panic(err)
	}
	go relay.Run(ctx)
	fmt.Println("published:", <-published)
	<-died

	var hc *outbox.HeadChangedError
	if err := relay.SkipEvent(ctx, "acct-1", "evt-3"); errors.As(err, &hc) {
		fmt.Println("refused: the head is", hc.Head)
	}
	dead, err := ob.Dead(ctx, 10) // what the operator's page shows
	if err != nil {
		panic(err)
	}
	if err := relay.SkipEvent(ctx, "acct-1", dead[0].ID); err != nil {
		panic(err)
	}
	fmt.Println("skipped:", dead[0].ID)
	fmt.Println("published:", <-published)
	if err := relay.Close(ctx); err != nil {
		panic(err)
	}
	// Output:
	// published: opened
	// refused: the head is evt-2
	// skipped: evt-2
	// published: deposited 100
}

// Recover is the operator's bulk Resume: after a fault is fixed it makes
// every dead row the filter selects (here: by its last error) pending again,
// key by key, and returns the rows it moved. It needs no relay; the relays
// running pick the rows up (a parked key resumes with its recovered head).
func ExampleOutbox_Recover() {
	ctx := context.Background()
	ob, cleanup := exampleOutbox(ctx, "opened", "deposited 100", "withdrew 30")
	defer cleanup()

	var broken atomic.Bool // the downstream rejects deposits until fixed
	broken.Store(true)
	published := make(chan string, 10)
	died := make(chan struct{}, 1)
	relay, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		if string(e.Payload) == "deposited 100" && broken.Load() {
			return keysched.Permanent(errors.New("downstream rejects deposits"))
		}
		published <- string(e.Payload)
		return nil
	}, outbox.WithFailurePolicy(keysched.Park), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithOnDead(func(outbox.DeadEvent) { died <- struct{}{} }))
	if err != nil {
		panic(err)
	}
	go relay.Run(ctx)
	fmt.Println("published:", <-published)
	<-died

	broken.Store(false) // fixed: recover every row that died of it
	rows, err := ob.Recoverable(ctx, outbox.RecoverFilter{ErrorContains: "rejects deposits"})
	if err != nil {
		panic(err)
	}
	fmt.Println("would recover:", len(rows))
	moved, err := ob.Recover(ctx, outbox.RecoverFilter{ErrorContains: "rejects deposits"})
	if err != nil {
		panic(err)
	}
	for _, r := range moved {
		fmt.Printf("recovered: %s on %s, %s after %d attempt(s): %s\n", r.ID, r.Key, r.State, r.Attempts, r.Err)
	}
	fmt.Println("published:", <-published)
	fmt.Println("published:", <-published)
	if err := relay.Close(ctx); err != nil {
		panic(err)
	}
	counts, _ := ob.Count(ctx)
	fmt.Println("dead rows left:", counts[outbox.Dead])
	// Output:
	// published: opened
	// would recover: 1
	// recovered: evt-2 on acct-1, dead after 1 attempt(s): downstream rejects deposits
	// published: deposited 100
	// published: withdrew 30
	// dead rows left: 0
}

// BusSink publishes outbox rows on the in-process event bus: each key's
// events reach the subscribers in order, decoded from the payload.
func ExampleBusSink() {
	ctx := context.Background()
	ob, cleanup := exampleOutbox(ctx, "100", "-30", "5")
	defer cleanup()

	b, err := bus.New[string]()
	if err != nil {
		panic(err)
	}
	type amount struct{ cents int }
	got := make(chan string, 10)
	if _, err := bus.Subscribe(b, "ledger", func(ctx context.Context, env bus.Envelope[string], a amount) error {
		got <- fmt.Sprintf("%s %s: %+d", env.ID, env.Key, a.cents)
		return nil
	}); err != nil {
		panic(err)
	}
	relay, err := ob.NewRelay(outbox.BusSink(b, func(e outbox.Event) (any, error) {
		n, err := strconv.Atoi(string(e.Payload)) // an error is permanent: the row dies
		return amount{n}, err
	}), outbox.WithPollInterval(10*time.Millisecond))
	if err != nil {
		panic(err)
	}
	go relay.Run(ctx)
	for range 3 {
		fmt.Println(<-got)
	}
	if err := relay.Close(ctx); err != nil {
		panic(err)
	}
	if err := b.Close(ctx); err != nil {
		panic(err)
	}
	// Output:
	// evt-1 acct-1: +100
	// evt-2 acct-1: -30
	// evt-3 acct-1: +5
}
