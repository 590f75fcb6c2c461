package kafka

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Property 7: offsets finished above the frontier travel in the commit
// metadata; a new owner handles the stuck offset 0 and not the 500 above it.
func TestMetadataSkipsFinished(t *testing.T) {
	tc := newCluster(t, 1, "t")
	commits := tc.watchCommits(t)
	group := groupName(t)
	rs := []*kgo.Record{rec("t", 0, "stuck", "0")}
	for i := range 500 {
		rs = append(rs, rec("t", 0, fmt.Sprintf("k%d", i%20), fmt.Sprint(i)))
	}
	tc.produce(t, rs...)
	a := runMember(t, func(ctx context.Context, r *kgo.Record) error {
		if r.Offset == 0 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}, WithLogger(quiet), WithCommitInterval(5*time.Millisecond), WithClientOptions(tc.clientOpts(group, "t")...))
	eventually(t, "a commit of 0 listing 1-500 as finished", func() bool {
		cs := commits.of("t", 0)
		return len(cs) > 0 && cs[len(cs)-1].Offset == 0 && fmt.Sprint(decodeFinished(cs[len(cs)-1].Metadata, 0)) == "[{1 500}]"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_ = a.c.Close(ctx) // gives up on offset 0
	cancel()
	<-a.done
	var mu sync.Mutex
	var got []int64
	b := runMember(t, func(ctx context.Context, r *kgo.Record) error {
		mu.Lock()
		got = append(got, r.Offset)
		mu.Unlock()
		return nil
	}, WithLogger(quiet), WithCommitInterval(5*time.Millisecond), WithClientOptions(tc.clientOpts(group, "t")...))
	tc.produce(t, rec("t", 0, "new", "x"))
	eventually(t, "the new owner handled offsets 0 and 501", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(got, 0) && slices.Contains(got, 501)
	})
	eventually(t, "commit of 502", func() bool {
		cs := commits.of("t", 0)
		return cs[len(cs)-1].Offset == 502
	})
	mu.Lock()
	if len(got) != 2 {
		t.Errorf("the new owner handled %d records (%v...), want only 0 and 501", len(got), got[:min(len(got), 10)])
	}
	mu.Unlock()
	if n := b.c.Stats().SkippedByMetadata; n != 500 {
		t.Errorf("SkippedByMetadata %d, want 500", n)
	}
	b.close(t)
}

// When the broker refuses the metadata as too large, the frontier is
// committed alone, and the log says so.
func TestMetadataTooLargeFallsBack(t *testing.T) {
	tc := newCluster(t, 1, "t")
	commits := tc.watchCommits(t)
	var mu sync.Mutex
	refused := 0
	tc.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		tc.KeepControl()
		r := req.(*kmsg.OffsetCommitRequest)
		withMeta := false
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				withMeta = withMeta || (p.Metadata != nil && *p.Metadata != "")
			}
		}
		if !withMeta {
			return nil, nil, false
		}
		mu.Lock()
		refused++
		mu.Unlock()
		resp := r.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range r.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.OffsetMetadataTooLarge.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	tc.produce(t, rec("t", 0, "stuck", "0"), rec("t", 0, "a", "1"), rec("t", 0, "b", "2"))
	logs := &logBuffer{}
	c := startConsumer(t, func(ctx context.Context, r *kgo.Record) error {
		if r.Offset == 0 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}, WithLogger(logs.logger()), WithCommitInterval(5*time.Millisecond), WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "the frontier committed alone after a refusal", func() bool {
		ps, _ := c.partStats("t", 0)
		return ps.Committed == 0 && strings.Contains(logs.String(), "refused the commit metadata as too large")
	})
	for _, cm := range commits.of("t", 0) {
		if cm.Offset != 0 {
			t.Errorf("commit %+v past the stuck offset", cm)
		}
	}
	mu.Lock()
	if refused == 0 {
		t.Error("no commit carried metadata")
	}
	mu.Unlock()
}

// When the finished offsets do not fit the limit, the longest prefix of
// their encoding that fits is committed (those nearest the frontier), and
// the log says so.
func TestMetadataDoesNotFit(t *testing.T) {
	tc := newCluster(t, 1, "t")
	commits := tc.watchCommits(t)
	var rs []*kgo.Record
	for i := range 40 {
		key := fmt.Sprintf("ok%d", i)
		if i%2 == 0 {
			key = fmt.Sprintf("stuck%d", i) // every other offset stuck: 20 runs
		}
		rs = append(rs, rec("t", 0, key, fmt.Sprint(i)))
	}
	tc.produce(t, rs...)
	logs := &logBuffer{}
	c := startConsumer(t, func(ctx context.Context, r *kgo.Record) error {
		if r.Offset%2 == 0 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}, WithLogger(logs.logger()), WithCommitMetadataLimit(32), WithCommitInterval(5*time.Millisecond),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "twenty records handled, the frontier committed alone", func() bool {
		return c.Stats().Finished == 20 && strings.Contains(logs.String(), "do not fit the commit metadata") &&
			len(commits.of("t", 0)) > 0
	})
	// Once all twenty finished, the prefix that fits: runs 1, 3, 5, ... in
	// order, nothing else.
	prefix := func(cm commitSeen) bool {
		runs := decodeFinished(cm.Metadata, 0)
		for i, s := range runs {
			if s.from != int64(2*i+1) || s.to != s.from {
				return false
			}
		}
		return len(runs) > 0
	}
	eventually(t, "a commit listing the finished offsets nearest the frontier", func() bool {
		cs := commits.of("t", 0)
		return prefix(cs[len(cs)-1])
	})
	cs := commits.of("t", 0)
	for _, cm := range cs {
		if len(cm.Metadata) > 32 || cm.Offset != 0 {
			t.Errorf("commit %+v: over the limit or past the frontier", cm)
		}
		// Finished offsets only (odd: single-offset runs), in order. A
		// commit made while some odd records were still running skips
		// them (1, 3, 7 while 5 runs).
		prev := int64(-1)
		for i, s := range decodeFinished(cm.Metadata, 0) {
			if s.from%2 != 1 || s.to != s.from || s.from <= prev {
				t.Errorf("commit %+v: run %d is %v, want an odd offset after %d", cm, i, s, prev)
			}
			prev = s.from
		}
	}
}

func TestMetadataEncoding(t *testing.T) {
	meta, truncated := encodeFinished(100, []int64{100, 105, 106, 200}, true, 1000, 4096)
	if truncated {
		t.Fatal("truncated")
	}
	want := []span{{101, 104}, {107, 199}, {201, 1000}}
	if got := decodeFinished(meta, 100); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%q decodes to %v, want %v", meta, got, want)
	}
	if got := decodeFinished(meta, 101); got != nil {
		t.Errorf("metadata for another offset decoded: %v", got)
	}
	for _, bad := range []string{"", "x", "ks1:", "ks1:2s", "ks1:2s:1", "ks1:2s:0.1", "ks1:2s:1.-1", "ks1:2s:zzzzzzzzzzzzzzzzzz.1"} {
		if got := decodeFinished(bad, 100); got != nil {
			t.Errorf("%q decodes to %v", bad, got)
		}
	}
	// Too long: the longest prefix that fits, nearest the frontier first.
	meta, truncated = encodeFinished(0, []int64{0, 2, 4, 6, 8, 10}, true, 12, 17)
	if !truncated || len(meta) > 17 || fmt.Sprint(decodeFinished(meta, 0)) != "[{1 1} {3 3} {5 5}]" {
		t.Errorf("%q (truncated %v) decodes to %v, want the first three runs", meta, truncated, decodeFinished(meta, 0))
	}
	if meta, truncated := encodeFinished(0, []int64{0, 2}, true, 12, 5); meta != "" || !truncated {
		t.Errorf("not even one run fits: %q, %v", meta, truncated)
	}
	// A list of unfinished offsets cut short: nothing past its end is
	// claimed finished (5-7 may be unfinished too).
	meta, _ = encodeFinished(0, []int64{0, 1, 2, 4}, false, 12, 4096)
	if fmt.Sprint(decodeFinished(meta, 0)) != "[{3 3}]" {
		t.Errorf("cut-short list: %q decodes to %v, want only 3", meta, decodeFinished(meta, 0))
	}
}
