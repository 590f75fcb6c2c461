package kafka

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/keysched/keysched"
)

// metricValues collects the reader's data points as "name{k=v,...}" ->
// value (int64 for sums and gauges, the count for histograms).
func metricValues(t *testing.T, r *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	id := func(name string, set attribute.Set) string {
		var kv []string
		for _, a := range set.ToSlice() {
			kv = append(kv, string(a.Key)+"="+a.Value.String())
		}
		return name + "{" + strings.Join(kv, ",") + "}"
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[id(m.Name, p.Attributes)] = p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[id(m.Name, p.Attributes)] = p.Value
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					out[id(m.Name, p.Attributes)] = int64(p.Value)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[id(m.Name, p.Attributes)] = int64(p.Count)
				}
			}
		}
	}
	return out
}

func partitionSeries(vals map[string]int64, part string) []string {
	var out []string
	for k := range vals {
		if strings.HasPrefix(k, "keysched.kafka.partition.") && strings.Contains(k, "messaging.destination.partition.id="+part+",") {
			out = append(out, k[:strings.Index(k, "{")])
		}
	}
	slices.Sort(out)
	return out
}

// WithMeterProvider: the messaging conventions' consumed count and process
// duration per partition, the per-partition gauges, the scheduler's
// instruments; a revoked partition's series are gone at the next
// collection, and Close ends them all.
func TestConsumerMetrics(t *testing.T) {
	tc := newCluster(t, 2, "t")
	group := groupName(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	tc.produce(t, rec("t", 0, "a", "ok"), rec("t", 0, "b", "ok"), rec("t", 0, "a", "ok"),
		rec("t", 1, "c", "ok"), rec("t", 1, "d", "fail"))
	h := func(_ context.Context, r *kgo.Record) error {
		if string(r.Value) == "fail" {
			return keysched.Permanent(errors.New("bad record"))
		}
		return nil
	}
	m1 := runMember(t, h, WithLogger(quiet), WithCommitInterval(10*time.Millisecond),
		WithMeterProvider(mp, attribute.String("service", "billing")),
		WithClientOptions(tc.clientOpts(group, "t")...))
	eventually(t, "every record finished and committed", func() bool {
		st := m1.c.Stats()
		if st.Finished != 5 || len(st.Partitions) != 2 {
			return false
		}
		for _, p := range st.Partitions {
			if p.Committed != []int64{3, 2}[p.Partition] {
				return false
			}
		}
		return true
	})

	vals := metricValues(t, reader)
	attrs := func(part, op string, more ...string) string {
		kv := []string{"messaging.consumer.group.name=" + group, "messaging.destination.name=t",
			"messaging.destination.partition.id=" + part}
		if op != "" {
			kv = append(kv, "messaging.operation.name="+op)
		}
		kv = append(kv, "messaging.system=kafka", "service=billing")
		kv = append(kv, more...)
		slices.Sort(kv)
		return "{" + strings.Join(kv, ",") + "}"
	}
	want := map[string]int64{
		"messaging.client.consumed.messages" + attrs("0", "poll"):                 3,
		"messaging.client.consumed.messages" + attrs("1", "poll"):                 2,
		"messaging.process.duration" + attrs("0", "process"):                      3,
		"messaging.process.duration" + attrs("1", "process"):                      1,
		"messaging.process.duration" + attrs("1", "process", "error.type=_OTHER"): 1,
		"keysched.kafka.partition.committed_offset" + attrs("0", ""):              3,
		"keysched.kafka.partition.committed_offset" + attrs("1", ""):              2,
		"keysched.kafka.partition.frontier" + attrs("0", ""):                      3,
		"keysched.kafka.partition.frontier" + attrs("1", ""):                      2,
		"keysched.kafka.partition.in_flight" + attrs("0", ""):                     0,
		"keysched.kafka.partition.in_flight" + attrs("1", ""):                     0,
		"keysched.kafka.partition.held" + attrs("0", ""):                          0,
		"keysched.kafka.partition.held" + attrs("1", ""):                          0,
		"keysched.kafka.partition.paused" + attrs("0", ""):                        0,
		"keysched.kafka.partition.paused" + attrs("1", ""):                        0,
		"keysched.kafka.partition.lag" + attrs("0", ""):                           0,
		"keysched.kafka.partition.lag" + attrs("1", ""):                           0,
	}
	for k, v := range want {
		got, ok := vals[k]
		if !ok || got != v {
			t.Errorf("%s = %d (present %t), want %d", k, got, ok, v)
		}
	}
	g := "messaging.consumer.group.name=" + group
	// The scheduler's tasks are groups (the records of one key from one
	// poll): key a's two records make one when they arrive in one poll.
	if v := vals["keysched.tasks.finished{"+g+",outcome=succeeded,service=billing}"]; v != 3 && v != 4 {
		t.Errorf("scheduler's succeeded tasks: %d, want 3 or 4", v)
	}
	if v := vals["keysched.tasks.finished{"+g+",outcome=failed,service=billing}"]; v != 1 {
		t.Errorf("scheduler's failed tasks: %d, want 1", v)
	}
	for k := range vals {
		for _, key := range []string{"=a", "=b", "=c", "=d"} {
			if strings.Contains(k, key+",") || strings.Contains(k, key+"}") {
				t.Errorf("a record key as an attribute value: %s", k)
			}
		}
	}
	t.Logf("%d series", len(vals))

	// A second member joins: one partition moves to it. The first member's
	// series for that partition are gone at the next collection.
	m2 := runMember(t, h, WithLogger(quiet), WithClientOptions(tc.clientOpts(group, "t")...))
	eventually(t, "the partitions split", func() bool {
		return len(m1.c.Stats().Partitions) == 1 && len(m2.c.Stats().Partitions) == 1
	})
	kept := m1.c.Stats().Partitions[0].Partition
	gone := 1 - kept
	vals = metricValues(t, reader)
	all := []string{"keysched.kafka.partition.committed_offset", "keysched.kafka.partition.frontier",
		"keysched.kafka.partition.held", "keysched.kafka.partition.in_flight", "keysched.kafka.partition.lag",
		"keysched.kafka.partition.paused"}
	if got := partitionSeries(vals, itoa(kept)); !slices.Equal(got, all) {
		t.Errorf("kept partition %d: series %v, want %v", kept, got, all)
	}
	if got := partitionSeries(vals, itoa(gone)); len(got) != 0 {
		t.Errorf("revoked partition %d still reported: %v", gone, got)
	}
	// The counters keep what the partition counted while owned.
	if v := vals["messaging.client.consumed.messages"+attrs(itoa(gone), "poll")]; v != []int64{3, 2}[gone] {
		t.Errorf("consumed of the revoked partition: %d", v)
	}

	m1.close(t)
	vals = metricValues(t, reader)
	for k := range vals {
		if strings.HasPrefix(k, "keysched.kafka.partition.") || strings.HasPrefix(k, "keysched.tasks.") || strings.HasPrefix(k, "keysched.keys.") {
			t.Errorf("after Close: %s still reported", k)
		}
	}
	m2.close(t)
}

func itoa(p int32) string { return string(rune('0' + p)) }

func TestWithMeterProviderErrors(t *testing.T) {
	h := func(context.Context, *kgo.Record) error { return nil }
	if _, err := NewConsumer(h, WithMeterProvider(nil)); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("nil MeterProvider: %v", err)
	}
	mp := sdkmetric.NewMeterProvider()
	defer mp.Shutdown(context.Background())
	if _, err := NewConsumer(h, WithMeterProvider(mp, attribute.KeyValue{})); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("invalid attribute: %v", err)
	}
}
