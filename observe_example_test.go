package keysched_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/keysched/keysched"
)

// An Observer times every task: the queue wait (acceptance to first start)
// and each attempt's duration. Here it keeps the slowest attempt; a metrics
// package records histograms instead (see otelkeysched).
func ExampleObserver() {
	ctx := context.Background()
	var mu sync.Mutex
	var slowest time.Duration
	var attempts int
	s, err := keysched.New[string](keysched.WithObserver(keysched.Observer[string]{
		AttemptEnded: func(key string, a keysched.AttemptInfo) {
			mu.Lock() // quick, never blocks for long: this runs on the worker
			defer mu.Unlock()
			attempts++
			slowest = max(slowest, a.Ended.Sub(a.Started))
		},
	}))
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	for _, d := range []time.Duration{time.Millisecond, 20 * time.Millisecond} {
		s.Submit(ctx, "acct-1", func(context.Context) error { time.Sleep(d); return nil })
	}
	s.Drain(ctx)
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(attempts, slowest >= 20*time.Millisecond)
	// Output: 2 true
}

// Keys lists the keys holding the most tasks, with their depth, whether they
// are parked, and how long their oldest task has waited (WithTaskAges):
// per-key detail for a debug endpoint, where metrics must not carry keys.
func ExampleScheduler_Keys_parked() {
	ctx := context.Background()
	parked := make(chan string, 1)
	s, _ := keysched.New[string](keysched.WithTaskAges(), keysched.WithFailurePolicy(keysched.Park),
		keysched.WithDeadLetter(func(dl keysched.DeadLetter[string]) { parked <- dl.Key })) // called once the key is parked
	release := make(chan struct{})
	for range 3 {
		s.Submit(ctx, "acct-busy", func(context.Context) error { <-release; return nil })
	}
	s.Submit(ctx, "acct-poison", func(context.Context) error { return errors.New("bad event") })
	s.Submit(ctx, "acct-poison", func(context.Context) error { return nil })
	<-parked
	for _, k := range s.Keys(10) {
		fmt.Printf("%s depth=%d parked=%t waited=%t\n", k.Key, k.Depth, k.Parked, k.HeadAge > 0)
	}
	poisonAge := s.KeyAge("acct-poison") // read first: ages grow while we read
	fmt.Println(s.OldestAge() >= poisonAge)
	close(release)
	s.Skip("acct-poison")
	s.Close(ctx)
	// Output:
	// acct-busy depth=3 parked=false waited=true
	// acct-poison depth=2 parked=true waited=true
	// true
}
