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

// Options that cannot hold with the client's are refused naming both: a
// dead-letter topic the consumer reads (a record failing for good would fail
// again in it, for ever), a revoke timeout the rebalance timeout cannot
// cover (the group would drop the member). A nil Option, no group or topic
// and a nil meter provider are refusals of one option.
func TestOptionsConflictingWithTheClientAreRefusedNamingBoth(t *testing.T) {
	h := func(context.Context, *kgo.Record) error { return nil }
	seed := kgo.SeedBrokers("127.0.0.1:1")
	for _, tc := range []struct {
		name         string
		opts         []Option
		option, with string
	}{
		{"dead-letter topic consumed", []Option{WithDeadLetterTopic("t"),
			WithClientOptions(seed, kgo.ConsumerGroup("g"), kgo.ConsumeTopics("a", "t"))}, "WithDeadLetterTopic", "WithClientOptions"},
		{"dead-letter topic matched by a regex", []Option{WithDeadLetterTopic("orders.dlq"),
			WithClientOptions(seed, kgo.ConsumerGroup("g"), kgo.ConsumeTopics("orders.*"), kgo.ConsumeRegex())}, "WithDeadLetterTopic", "WithClientOptions"},
		{"revoke timeout at the rebalance timeout", []Option{WithRevokeTimeout(time.Minute),
			WithClientOptions(seed, kgo.ConsumerGroup("g"), kgo.ConsumeTopics("a"))}, "WithRevokeTimeout", "WithClientOptions"},
		{"revoke timeout past a shorter rebalance timeout", []Option{WithRevokeTimeout(10 * time.Second),
			WithClientOptions(seed, kgo.ConsumerGroup("g"), kgo.ConsumeTopics("a"), kgo.RebalanceTimeout(5*time.Second))}, "WithRevokeTimeout", "WithClientOptions"},
		{"no topic", []Option{WithClientOptions(seed, kgo.ConsumerGroup("g"))}, "WithClientOptions", ""},
		// franz-go refuses the options the adapter adds without a
		// group, in words about autocommitting: the refusal is the
		// adapter's own.
		{"no group", []Option{WithClientOptions(seed, kgo.ConsumeTopics("t"))}, "WithClientOptions", ""},
		{"no group and no topic", []Option{WithClientOptions(seed)}, "WithClientOptions", ""},
		{"nil option", []Option{nil}, "opts[0]", ""},
		{"nil meter provider", []Option{WithMeterProvider(nil)}, "WithMeterProvider", ""},
	} {
		c, err := NewConsumer(h, tc.opts...)
		if c != nil {
			t.Errorf("%s: a consumer came back with the error", tc.name)
			_ = c.Close(context.Background())
		}
		if p := opttest.Problem(err, opttest.Want{Option: tc.option, With: tc.with, Prefix: "kafka: invalid option: ", Sentinels: []error{ErrInvalidOption}}); p != "" {
			t.Errorf("%s: %s", tc.name, p)
		}
		if strings.HasPrefix(tc.name, "no group") && (err == nil || !strings.Contains(err.Error(), "no kgo.ConsumerGroup") || strings.Contains(err.Error(), "autocommit")) {
			t.Errorf("%s: %v, want the adapter's words for a missing group", tc.name, err)
		}
	}
	// The same options apart are accepted: a dead-letter topic not consumed,
	// a revoke timeout below the rebalance timeout.
	// A client option franz-go refuses: the error says what the adapter
	// sets itself, not only that it needs a group and topics.
	_, err := NewConsumer(h, WithClientOptions(seed, kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"), kgo.AutoCommitMarks()))
	if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "kgo.AutoCommitMarks") {
		t.Errorf("kgo.AutoCommitMarks: %v, want an ErrInvalidOption naming it", err)
	}
	// An *OptionError as every other refusal, carrying franz-go's error.
	var oe *keysched.OptionError
	if !errors.As(err, &oe) || oe.Option != "WithClientOptions" || oe.Err == nil || !errors.Is(err, keysched.ErrInvalidOption) {
		t.Errorf("kgo.AutoCommitMarks: %#v, want a *keysched.OptionError of WithClientOptions with franz-go's error in Err", err)
	}
	c, err := NewConsumer(h, WithDeadLetterTopic("t.dlq"), WithRevokeTimeout(4*time.Second),
		WithClientOptions(seed, kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"), kgo.RebalanceTimeout(5*time.Second)))
	if err != nil {
		t.Fatalf("accepted options refused: %v", err)
	}
	_ = c.Close(context.Background())
	// Without WithRevokeTimeout the default (10 s) gives way to half a
	// shorter rebalance timeout.
	c, err = NewConsumer(h, WithClientOptions(seed, kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"), kgo.RebalanceTimeout(4*time.Second)))
	if err != nil {
		t.Fatalf("default revoke timeout with a short rebalance timeout refused: %v", err)
	}
	if c.cfg.revokeTimeout != 2*time.Second {
		t.Errorf("default revoke timeout with a 4 s rebalance timeout: %v, want 2s", c.cfg.revokeTimeout)
	}
	_ = c.Close(context.Background())
}
