package keysched_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/keysched/keysched"
)

// A batch (a Kafka fetch, a page of a queue) is submitted in one call; each
// key's tasks keep the batch's order, and the Completions come back in the
// items' order.
func ExampleScheduler_SubmitBatch() {
	ctx := context.Background()
	s, err := keysched.New[string]()
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)

	var mu sync.Mutex
	seen := map[string][]string{}
	var items []keysched.BatchItem[string]
	for _, ev := range []string{"alice:open", "bob:open", "alice:deposit", "alice:close", "bob:close"} {
		key, what, _ := strings.Cut(ev, ":")
		items = append(items, keysched.BatchItem[string]{Key: key, Task: func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			seen[key] = append(seen[key], what)
			return nil
		}})
	}
	cs, err := s.SubmitBatch(ctx, items)
	if err != nil {
		panic(err)
	}
	for _, c := range cs {
		if err := c.Wait(ctx); err != nil {
			panic(err)
		}
	}
	fmt.Println(len(cs), seen["alice"], seen["bob"])
	// Output: 5 [open deposit close] [open close]
}

// TrySubmitBatch accepts the longest prefix that fits and says why the rest
// did not: resubmit items[len(cs):] later to go on in order.
func ExampleScheduler_TrySubmitBatch() {
	ctx := context.Background()
	s, err := keysched.New[int](keysched.WithMaxKeyDepth(2))
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)

	gate := make(chan struct{})
	wait := func(context.Context) error { <-gate; return nil }
	items := []keysched.BatchItem[int]{{Key: 1, Task: wait}, {Key: 1, Task: wait}, {Key: 1, Task: wait}, {Key: 2, Task: wait}}
	cs, err := s.TrySubmitBatch(ctx, items)
	fmt.Println(len(cs), errors.Is(err, keysched.ErrKeyFull))
	close(gate)
	rest, err := s.SubmitBatch(ctx, items[len(cs):])
	fmt.Println(len(rest), err)
	// Output:
	// 2 true
	// 2 <nil>
}
