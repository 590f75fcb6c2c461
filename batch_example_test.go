package keysched_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/keysched/keysched"
)

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
