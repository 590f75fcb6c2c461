package kafka

import (
	"context"
	"errors"
	"go.opentelemetry.io/otel/metric/noop"
	"strings"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/opttest"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestBadOptions(t *testing.T) {
	tc := newCluster(t, 1, "t")
	ok := WithClientOptions(tc.clientOpts("g", "t")...)
	h := func(context.Context, *kgo.Record) error { return nil }
	if _, err := NewConsumer(nil, ok); !errors.Is(err, ErrNilHandler) {
		t.Errorf("nil handler: %v", err)
	}
	cases := map[string][]Option{
		"nil option":          {ok, nil},
		"max in flight 0":     {ok, WithMaxInFlight(0)},
		"commit interval 0":   {ok, WithCommitInterval(0)},
		"negative revoke":     {ok, WithRevokeTimeout(-1)},
		"empty dlq topic":     {ok, WithDeadLetterTopic("")},
		"nil logger":          {ok, WithLogger(nil)},
		"bad ordering":        {ok, WithOrdering(Ordering(9))},
		"negative meta limit": {ok, WithCommitMetadataLimit(-1)},
		"poll records 0":      {ok, WithMaxPollRecords(0)},
		"nil client option":   {WithClientOptions(nil)},
		"no group":            {WithClientOptions(kgo.SeedBrokers(tc.addrs...), kgo.ConsumeTopics("t"))},
		"no topics":           {WithClientOptions(kgo.SeedBrokers(tc.addrs...), kgo.ConsumerGroup("g"))},
		"bad scheduler":       {ok, WithSchedulerOptions(keysched.WithWorkers(0))},
		"nil sched option":    {ok, WithSchedulerOptions(nil)},
		// The consumer's own dead-letter function and observer would
		// replace these silently: they are refused instead.
		"own dead letter": {ok, WithSchedulerOptions(keysched.WithDeadLetter(func(keysched.DeadLetter[string]) {}))},
		"own observer":    {ok, WithSchedulerOptions(keysched.WithObserver(keysched.Observer[string]{}))},
		"own observer with metrics": {ok, WithMeterProvider(noop.NewMeterProvider()),
			WithSchedulerOptions(keysched.WithObserver(keysched.Observer[string]{}))},
	}
	for name, opts := range cases {
		c, err := NewConsumer(h, opts...)
		if !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
		if c != nil {
			t.Errorf("%s: a consumer came back with the error", name)
		}
		if strings.HasPrefix(name, "own ") && (err == nil || !strings.Contains(err.Error(), "WithDeadLetterTopic and WithMeterProvider")) {
			t.Errorf("%s: %v, want an error that says what to use instead", name, err)
		}
		if (name == "no group" || name == "no topics") && (err == nil || !strings.Contains(err.Error(), "kgo.ConsumerGroup")) {
			t.Errorf("%s: %v, want an error that names what the adapter needs", name, err)
		}
	}
	if _, err := NewConsumer(h, ok, WithSchedulerOptions(keysched.WithWorkers(0))); !errors.Is(err, keysched.ErrInvalidOption) {
		t.Errorf("scheduler option error does not wrap keysched.ErrInvalidOption: %v", err)
	}
	// The scheduler's refusal keeps its type: errors.As names the option.
	var oe *keysched.OptionError
	if _, err := NewConsumer(h, ok, WithSchedulerOptions(keysched.WithMaxPending(0))); !errors.As(err, &oe) || oe.Option != "WithMaxPending" {
		t.Errorf("scheduler option error: %v, want a *keysched.OptionError naming WithMaxPending", err)
	}
	c, err := NewConsumer(h, ok)
	if err != nil {
		t.Fatal(err)
	}
	if c.Group() != "g" || c.Stats().Group != "g" {
		t.Errorf("group %q", c.Group())
	}
	//nolint:staticcheck // testing the nil-context error
	if err := c.Run(nil); !errors.Is(err, ErrNilContext) {
		t.Errorf("Run(nil): %v", err)
	}
	if err := c.Resume(ParkedKey{Topic: "t"}); !errors.Is(err, ErrNotParked) {
		t.Errorf("Resume of an unknown key: %v", err)
	}
	//nolint:staticcheck
	if err := c.Close(nil); !errors.Is(err, ErrNilContext) {
		t.Errorf("Close(nil): %v", err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Errorf("Close without Run: %v", err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close: %v", err)
	}
	if err := c.Skip(ParkedKey{Topic: "t"}); !errors.Is(err, ErrClosed) {
		t.Errorf("Skip after Close: %v", err)
	}
}

func TestRunTwice(t *testing.T) {
	tc := newCluster(t, 1, "t")
	c := startConsumer(t, func(context.Context, *kgo.Record) error { return nil }, WithLogger(quiet),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "Run started", func() bool { return c.running.Load() })
	if err := c.Run(context.Background()); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run: %v", err)
	}
}

func TestRunReturnsWhenContextEnds(t *testing.T) {
	tc := newCluster(t, 1, "t")
	c, err := NewConsumer(func(context.Context, *kgo.Record) error { return nil }, WithLogger(quiet),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	eventually(t, "Run started", func() bool { return c.running.Load() })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v, want context.Canceled", err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// Each Option of this package that NewConsumer refuses is a
// *keysched.OptionError naming it, as every keysched module's refused option
// is: errors.As finds it, errors.Is matches ErrInvalidOption and
// keysched.ErrInvalidOption, and the text begins "kafka: invalid option:
// Name". NewConsumer checks the options before it makes a client: no
// cluster is needed.
func TestRefusedOptionIsAnOptionErrorNamingIt(t *testing.T) {
	h := func(context.Context, *kgo.Record) error { return nil }
	for _, tc := range []struct {
		opt    Option
		option string
	}{
		{WithClientOptions(kgo.ConsumerGroup("g"), nil), "WithClientOptions"},
		{WithSchedulerOptions(nil), "WithSchedulerOptions"},
		{WithOrdering(Ordering(9)), "WithOrdering"},
		{WithMaxInFlight(0), "WithMaxInFlight"},
		{WithCommitInterval(0), "WithCommitInterval"},
		{WithRevokeTimeout(-time.Second), "WithRevokeTimeout"},
		{WithDeadLetterTopic(""), "WithDeadLetterTopic"},
		{WithLogger(nil), "WithLogger"},
		{WithCommitMetadataLimit(-1), "WithCommitMetadataLimit"},
		{WithMaxPollRecords(0), "WithMaxPollRecords"},
	} {
		c, err := NewConsumer(h, tc.opt)
		if c != nil {
			t.Errorf("%s: a consumer came back with the error", tc.option)
		}
		if p := opttest.Problem(err, opttest.Want{Option: tc.option, Prefix: "kafka: invalid option: ", Sentinels: []error{ErrInvalidOption}}); p != "" {
			t.Error(p)
		}
	}
}
