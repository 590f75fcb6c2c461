package keysched_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/keysched/keysched"
)

// One reader, one hot key: a program that reads one stream (a partition, a
// queue, a file) and submits each event must not wait in Submit for the
// hot key's room (WithMaxKeyDepth): every key behind it would wait too. The
// reader calls TrySubmit; a task its key has no room for is held, in order,
// in that key's overflow, which a goroutine of its own hands on with Submit
// (waiting for that key only); the key's later events join its overflow
// while it has one. When the overflow of all keys reaches a bound, the reader
// stops reading: back-pressure on the source, not on one key.
func Example_oneReaderHotKey() {
	ctx := context.Background()
	s, err := keysched.New[string](keysched.WithWorkers(4), keysched.WithMaxKeyDepth(4))
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)

	var (
		mu      sync.Mutex
		room    = sync.NewCond(&mu)            // signalled when an overflow shrinks
		held    = map[string][]keysched.Task{} // each key's overflow, in order
		nHeld   int
		maxHeld = 64 // then the reader waits: back-pressure on the source
		feeders sync.WaitGroup
		lost    []error // tasks a feeder could not hand on (ctx ended, Close)
	)
	// feed hands key's overflow to the scheduler, in order, then ends.
	feed := func(key string) {
		defer feeders.Done()
		for {
			mu.Lock()
			q := held[key]
			if len(q) == 0 {
				delete(held, key) // later events of key go straight to TrySubmit
				mu.Unlock()
				return
			}
			mu.Unlock()
			_, err := s.Submit(ctx, key, q[0]) // waits for this key's room only
			mu.Lock()
			if err != nil {
				lost = append(lost, err)
			}
			held[key] = held[key][1:]
			nHeld--
			room.Broadcast()
			mu.Unlock()
		}
	}
	// submit is what the reader calls for each event; it never waits on a key.
	submit := func(key string, task keysched.Task) error {
		mu.Lock()
		defer mu.Unlock()
		for nHeld >= maxHeld {
			room.Wait() // back-pressure: stop reading until some overflow moves
		}
		if q, ok := held[key]; ok {
			held[key] = append(q, task) // behind the key's overflow: keeps its order
			nHeld++
			return nil
		}
		_, err := s.TrySubmit(ctx, key, task)
		if errors.Is(err, keysched.ErrKeyFull) || errors.Is(err, keysched.ErrFull) {
			held[key] = []keysched.Task{task}
			nHeld++
			feeders.Add(1)
			go feed(key)
			return nil
		}
		return err // ErrClosed, ErrInvalidKey, ...: nothing was accepted
	}

	// The stream: every other event is for the hot key, whose handler is
	// slow; the cold keys' handlers are quick.
	var ran sync.Mutex
	order := map[string][]int{}
	for i := range 400 {
		key, work := fmt.Sprintf("cold-%d", i%7), time.Duration(0)
		if i%2 == 0 {
			key, work = "hot", 200*time.Microsecond
		}
		err := submit(key, func(context.Context) error {
			time.Sleep(work)
			ran.Lock()
			order[key] = append(order[key], i)
			ran.Unlock()
			return nil
		})
		if err != nil {
			panic(err)
		}
	}
	feeders.Wait()
	if err := s.Drain(ctx); err != nil {
		panic(err)
	}
	inOrder, n := true, 0
	for _, seq := range order {
		inOrder = inOrder && slices.IsSorted(seq)
		n += len(seq)
	}
	fmt.Println("events run:", n, "lost:", len(lost), "in order per key:", inOrder)
	// Output: events run: 400 lost: 0 in order per key: true
}
