package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
)

func (s *stream) consume(name string, seeds []string, topic, group string, c *cli, work workSpec) (Result, error) {
	t := newTally(s, work, c.HotKey)
	copts := []kgo.Opt{
		kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.WithHooks(t),
		kgo.FetchMaxWait(c.FetchMaxWait),
	}
	if c.FetchPartBytes > 0 {
		copts = append(copts, kgo.FetchMaxPartitionBytes(c.FetchPartBytes))
	}
	if c.HotKey {
		copts = append(copts, kgo.WithHooks(bufferedHook{t}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	var err error
	switch name {
	case "plain":
		err = runPlain(ctx, copts, t)
	case "ideal":
		err = runIdeal(ctx, t, c.Workers)
	default:
		order := kafka.KeyOrder
		if name == "keysched-partition" {
			order = kafka.PartitionOrder
		}
		err = runAdapter(ctx, copts, t, order, c)
	}
	if err != nil {
		return Result{}, err
	}
	r := t.result(name)
	if c.HotKey {
		r.HotKey = t.hotKey()
	}
	return r, nil
}

func runAdapter(ctx context.Context, copts []kgo.Opt, t *tally, order kafka.Ordering, c *cli) error {
	cons, err := kafka.NewConsumer(t.handle, kafka.WithClientOptions(copts...), kafka.WithOrdering(order),
		kafka.WithMaxInFlight(c.MaxInFlight), kafka.WithCommitInterval(time.Second),
		kafka.WithSchedulerOptions(keysched.WithWorkers(c.Workers), keysched.WithMaxPending(max(keysched.DefaultMaxPending, c.MaxInFlight*c.Partitions))))
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	var werr error
	select {
	case <-t.all:
	case <-ctx.Done():
		werr = fmt.Errorf("handled %d of %d events before --timeout", t.count(), t.s.n)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	_ = cons.Close(cctx)
	if err := <-done; err != nil && werr == nil && !errors.Is(err, context.DeadlineExceeded) {
		werr = err
	}
	return werr
}

// runIdeal runs the stream's work as an ideal consumer would, with no
// broker and no adapter, in this process: every record at hand from the
// start, each key's records one after another on a goroutine of its own that
// holds one of the workers for the key's whole chain (no hand-off between
// its records), keys started in the order of their first record, at most
// workers at a time. It is what the stream's work takes here under the
// stream's own concurrency (up to workers handlers at once, then fewer as
// keys run out), which the measured bound (one call at a time, alone) does
// not see; its "of measured bound" says how much of that bound any consumer
// can reach here at that moment.
func runIdeal(ctx context.Context, t *tally, workers int) error {
	chains := make([][]int, t.s.keys)
	for seq, id := range t.s.ids {
		chains[id] = append(chains[id], seq)
	}
	sem := make(chan struct{}, workers)
	t.start.Store(time.Now().UnixNano())
	for _, chain := range chains {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("handled %d of %d events before --timeout", t.count(), t.s.n)
		}
		go func() {
			defer func() { <-sem }()
			for _, seq := range chain {
				r := &kgo.Record{Value: encodeValue(seq, t.s.ids[seq], t.s.ord[seq])}
				t.markPolled(seq, t.start.Load())
				if t.hot {
					t.buffered[seq].Store(t.start.Load())
				}
				_ = t.handle(ctx, r)
			}
		}()
	}
	select {
	case <-t.all:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("handled %d of %d events before --timeout", t.count(), t.s.n)
	}
}

// runPlain is franz-go's goroutine-per-partition consumer: the poll loop
// hands each partition's records to that partition's goroutine, which
// handles them one at a time and marks them for the next autocommit.
func runPlain(ctx context.Context, copts []kgo.Opt, t *tally) error {
	var (
		mu      sync.Mutex
		workers = map[int32]chan []*kgo.Record{}
		wg      sync.WaitGroup
	)
	stopAll := func() {
		mu.Lock()
		for p, ch := range workers {
			close(ch)
			delete(workers, p)
		}
		mu.Unlock()
		wg.Wait()
	}
	cl, err := kgo.NewClient(append(copts, kgo.AutoCommitMarks(), kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, _ map[string][]int32) {
			// One member: revokes come only with the final close.
			_ = cl.CommitMarkedOffsets(ctx)
		}))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	go func() {
		select {
		case <-t.all:
		case <-ctx.Done():
		}
		cl.CloseAllowingRebalance()
	}()
	for {
		fs := cl.PollRecords(ctx, 10000)
		if fs.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			mu.Lock()
			ch := workers[p.Partition]
			if ch == nil {
				ch = make(chan []*kgo.Record, 16)
				workers[p.Partition] = ch
				wg.Add(1)
				go func() {
					defer wg.Done()
					for rs := range ch {
						for _, r := range rs {
							_ = t.handle(ctx, r)
						}
						cl.MarkCommitRecords(rs...)
					}
				}()
			}
			mu.Unlock()
			ch <- p.Records
		})
		cl.AllowRebalance()
	}
	stopAll()
	select {
	case <-t.all:
		return nil
	default:
		return fmt.Errorf("handled %d of %d events before --timeout", t.count(), t.s.n)
	}
}
