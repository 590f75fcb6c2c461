package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keysched/keysched/internal/trace"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// bound is the stream's best events/s with work w per event and the given
// workers: events / max(hottest key's events x w, events x w / workers).
func (s *stream) bound(w time.Duration, workers int) float64 {
	secs := max(float64(s.hottest)*w.Seconds(), float64(s.n)*w.Seconds()/float64(workers))
	return float64(s.n) / secs
}

func loadEvents(c *cli) ([]trace.Event, error) {
	switch {
	case c.Trace != "":
		return trace.LoadFile(c.Trace)
	case c.Synthetic:
		return trace.Synthetic(c.Events, c.Keys, c.Zipf, c.Seed)
	}
	return trace.Sample(), nil
}

func createTopic(seeds []string, topic string, partitions int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, int32(partitions), -1
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		return err
	}
	return kerr.ErrorForCode(resp.Topics[0].ErrorCode)
}

// stream is the produced stream and what the consumers' handlers check
// against it.
type stream struct {
	// events is the stream to produce, nil once produced: a million
	// events' strings would be scanned by every garbage collection during
	// the consumers' runs, a cost of the benchmark's own (most to the
	// consumer that runs longest) that no real consumer process has.
	events  []trace.Event
	n       int     // len(events)
	ids     []int32 // key id of each event
	ord     []int32 // position of each event within its key
	keys    int
	hottest int
}

func newStream(events []trace.Event) *stream {
	ids, keys := trace.KeyIDs(events)
	s := &stream{events: events, n: len(events), ids: ids, ord: make([]int32, len(events)), keys: len(keys)}
	n := make([]int32, len(keys))
	for i, id := range ids {
		s.ord[i] = n[id]
		n[id]++
		s.hottest = max(s.hottest, int(n[id]))
	}
	return s
}

func produce(seeds []string, topic string, s *stream) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(100000))
	if err != nil {
		return err
	}
	defer cl.Close()
	var first atomic.Pointer[error]
	var wg sync.WaitGroup
	for i := range s.events {
		wg.Add(1)
		cl.Produce(context.Background(), &kgo.Record{Key: []byte(s.events[i].Key), Value: encodeValue(i, s.ids[i], s.ord[i])}, func(_ *kgo.Record, err error) {
			if err != nil {
				first.CompareAndSwap(nil, &err)
			}
			wg.Done()
		})
	}
	wg.Wait()
	s.events = nil // see stream
	if e := first.Load(); e != nil {
		return *e
	}
	return nil
}
