package kafka

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.uber.org/goleak"
)

// A NewConsumer refused after its client was made (a dead-letter topic that
// is also consumed) closes that client, and franz-go may have joined the
// group and assigned partitions by then: the revoke that the close runs
// must not touch the consumer that was never made. Before, it called
// ResumeFetchPartitions on its nil client: a nil pointer dereference on
// franz-go's goroutine, which no caller can recover (a fresh-user trial
// saw it within 8-73 refused calls, 4 runs of 4).
func TestRefusedConsumerIgnoresItsClientsGroupCallbacks(t *testing.T) {
	tc := newCluster(t, 4, "payments")
	h := func(context.Context, *kgo.Record) error { return nil }
	for i := range 80 {
		_, err := NewConsumer(h,
			WithClientOptions(tc.clientOpts(fmt.Sprintf("%s-%d", groupName(t), i), "payments")...),
			WithDeadLetterTopic("payments"))
		require.Error(t, err)
		require.True(t, errors.Is(err, ErrInvalidOption), "%v", err)
	}
}

// panickingMeterProvider's meters panic when the consumer registers its
// metrics' callback: a caller's meter provider that panics inside
// NewConsumer, after its client was made.
type panickingMeterProvider struct{ noop.MeterProvider }

func (panickingMeterProvider) Meter(string, ...metric.MeterOption) metric.Meter {
	return panickingMeter{}
}

type panickingMeter struct{ noop.Meter }

func (panickingMeter) RegisterCallback(metric.Callback, ...metric.Observable) (metric.Registration, error) {
	panic("meter provider fails")
}

// A panic inside NewConsumer after its client was made (a caller's meter
// provider) leaves neither the client nor its group callbacks behind: they
// waited for ever for NewConsumer's decision, and the client stayed in the
// group (goleak finds its goroutines).
func TestNewConsumerPanickingLeavesNoClientBehind(t *testing.T) {
	tc := newCluster(t, 2, "payments")
	h := func(context.Context, *kgo.Record) error { return nil }
	before := goleak.IgnoreCurrent()
	func() {
		defer func() { require.Equal(t, "meter provider fails", recover()) }()
		_, _ = NewConsumer(h, WithClientOptions(tc.clientOpts(groupName(t), "payments")...),
			WithMeterProvider(panickingMeterProvider{}))
	}()
	require.Eventually(t, func() bool { return goleak.Find(before) == nil }, 10*time.Second, 20*time.Millisecond,
		"goroutines left behind: %v", goleak.Find(before))
}
