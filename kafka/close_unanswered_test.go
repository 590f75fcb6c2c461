package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The coordinator answering neither OffsetCommit nor LeaveGroup (kfake
// holds both until the test ends; they share franz-go's connection with
// heartbeats and OffsetFetch, so those are held behind them) while Close
// runs: Close returns within its context plus CloseMargin, says the
// frontiers were not committed, Run returns nil, and once the broker
// answers again no goroutine of the consumer is left (goleak, TestMain).
//
// Four consumers (four groups) close at once: franz-go's own Close sent a
// LeaveGroup of its own, with no deadline but its 30 s retry timeout,
// whenever its leave goroutine won a race against the consumer's (about
// one Close in two under -race), so that each run of the test meets it.
func TestCloseBoundedWhenTheCoordinatorAnswersNothing(t *testing.T) {
	const members, N = 4, 20
	tc := newCluster(t, 2, "t")
	tc.produceSpread(t, "t", 2, N)
	cs := make([]*Consumer, members)
	groups := make([]string, members)
	runDone := make([]chan error, members)
	for i := range members {
		groups[i] = groupName(t)
		c, err := NewConsumer(func(context.Context, *kgo.Record) error { return nil },
			WithLogger(quiet), WithCommitInterval(20*time.Millisecond), WithClientOptions(tc.clientOpts(groups[i], "t")...))
		if err != nil {
			t.Fatal(err)
		}
		cs[i], runDone[i] = c, make(chan error, 1)
		go func() { runDone[i] <- c.Run(context.Background()) }()
	}
	for i, c := range cs {
		eventually(t, fmt.Sprintf("consumer %d: every record handled and committed", i), func() bool {
			p0, _ := c.partStats("t", 0)
			p1, _ := c.partStats("t", 1)
			return c.Stats().Finished == N && p0.Committed == N/2 && p1.Committed == N/2
		})
	}
	// Released at the end; the cluster closes only once every held
	// request has gone on (kfake left goroutines behind when it closed
	// with several of them waking).
	release := make(chan struct{})
	var held atomic.Int32
	var once sync.Once
	unhold := func() {
		once.Do(func() { close(release) })
		eventually(t, "every held request gone on", func() bool { return held.Load() == 0 })
	}
	t.Cleanup(unhold)
	var mu sync.Mutex
	commitsHeld := map[string]int{}
	tc.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		tc.KeepControl()
		mu.Lock()
		commitsHeld[req.(*kmsg.OffsetCommitRequest).Group]++
		mu.Unlock()
		held.Add(1)
		tc.SleepControl(func() { <-release })
		held.Add(-1)
		return nil, nil, false
	})
	tc.ControlKey(int16(kmsg.LeaveGroup), func(kmsg.Request) (kmsg.Response, error, bool) {
		tc.KeepControl()
		held.Add(1)
		tc.SleepControl(func() { <-release })
		held.Add(-1)
		return nil, nil, false
	})
	tc.produceSpread(t, "t", 2, N)
	for i, c := range cs {
		eventually(t, fmt.Sprintf("consumer %d: every record handled, an interval commit held", i), func() bool {
			mu.Lock()
			defer mu.Unlock()
			return c.Stats().Finished == 2*N && commitsHeld[groups[i]] > 0
		})
	}
	const ctxD = 300 * time.Millisecond
	var wg sync.WaitGroup
	errs := make([]error, members)
	took := make([]time.Duration, members)
	for i, c := range cs {
		wg.Go(func() { errs[i], took[i] = closeWithin(c, ctxD) })
	}
	wg.Wait()
	for i := range cs {
		if bound := ctxD + CloseMargin + time.Second; took[i] > bound { // generous: a loaded machine
			t.Errorf("consumer %d: Close took %v with a %v context (bound %v)", i, took[i], ctxD, bound)
		}
		if !errors.Is(errs[i], ErrNotCommitted) {
			t.Errorf("consumer %d: Close: %v, want ErrNotCommitted", i, errs[i])
		}
		select {
		case err := <-runDone[i]:
			if err != nil {
				t.Errorf("consumer %d: Run: %v", i, err)
			}
		case <-time.After(time.Second):
			t.Errorf("consumer %d: Run did not return within a second of Close", i)
		}
	}
	t.Logf("Close took %v", took)
	unhold()
}
