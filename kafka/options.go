package kafka

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/optcheck"
	"github.com/keysched/keysched/internal/opterror"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Defaults applied by NewConsumer when no option sets them.
const (
	// DefaultMaxInFlight bounds each partition's records fetched and not
	// finished (queued, running, waiting for a retry, parked, or held
	// back by the poll loop). A record costs its bytes plus about 300
	// bytes of bookkeeping.
	DefaultMaxInFlight = 4096
	// DefaultCommitInterval is how often the frontiers of owned
	// partitions are committed (franz-go's auto-commit default).
	DefaultCommitInterval = 5 * time.Second
	// DefaultRevokeTimeout is how long a revoke (or loss) waits for the
	// revoked partitions' running handlers before interrupting them. Keep
	// it well below the group's rebalance timeout (franz-go: 60 s).
	DefaultRevokeTimeout = 10 * time.Second
	// DefaultMetadataMaxBytes bounds the commit metadata that lists the
	// offsets finished above the frontier: the broker's default
	// offset.metadata.max.bytes.
	DefaultMetadataMaxBytes = 4096
	// DefaultMaxPollRecords bounds the records one poll returns.
	DefaultMaxPollRecords = 10000
)

// Ordering says which records of a partition must be handled one at a time.
type Ordering int

const (
	// KeyOrder (the default): records with the same (topic, partition,
	// key) are handled one at a time in offset order; different keys run
	// concurrently. Records with a nil key share one chain per partition
	// (an empty, non-nil key is a key of its own).
	KeyOrder Ordering = iota
	// PartitionOrder: the records of a partition are handled one at a
	// time in offset order, like a plain consumer with one goroutine per
	// partition.
	PartitionOrder
	// Unordered: every record runs as soon as a worker is free.
	Unordered
)

func (o Ordering) String() string {
	switch o {
	case KeyOrder:
		return "KeyOrder"
	case PartitionOrder:
		return "PartitionOrder"
	case Unordered:
		return "Unordered"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// Sentinel errors; compare with errors.Is.
var (
	// ErrInvalidOption is wrapped by every error NewConsumer returns for
	// a bad option. The refusal of an Option of this package is a
	// *keysched.OptionError with this Sentinel (it matches
	// keysched.ErrInvalidOption too); a scheduler option's refusal wraps
	// the scheduler's.
	ErrInvalidOption = errors.New("kafka: invalid option")
	// ErrNilHandler is returned by NewConsumer for a nil Handler.
	ErrNilHandler = errors.New("kafka: nil handler")
	// ErrClosed is returned by Run, Resume and Skip once Close has started.
	ErrClosed = errors.New("kafka: consumer closed")
	// ErrRunning is returned by a second call of Run.
	ErrRunning = errors.New("kafka: Run already called")
	// ErrNotParked is returned by Resume and Skip for a key that is not
	// parked (or whose partition this member no longer owns).
	ErrNotParked = errors.New("kafka: key is not parked")
	// ErrLeftParked is wrapped by Close's error when it left records of
	// parked keys unfinished: once Close has started nothing resumes or
	// skips a parked key, so Close does not wait for them. Their
	// partitions' frontiers stay at the parked records and the next owner
	// handles them (parking them again if they fail again); Resume or Skip
	// before Close to settle them.
	ErrLeftParked = errors.New("kafka: close: records of parked keys left unfinished")
	// ErrNilContext is returned for a nil context.Context.
	ErrNilContext = errors.New("kafka: nil context")
	// ErrZeroConsumer is returned by the methods of a nil or zero Consumer
	// (one not made by NewConsumer) that return an error; the others
	// return zero values.
	ErrZeroConsumer = errors.New("kafka: nil or zero Consumer (make one with NewConsumer)")
)

// An Option configures NewConsumer. A bad value makes NewConsumer fail with
// a *keysched.OptionError that names the option (errors.As retrieves it, as
// it does every keysched module's refused option; errors.Is matches both
// ErrInvalidOption and keysched.ErrInvalidOption); a scheduler option's
// refusal (WithSchedulerOptions) wraps the scheduler's *keysched.OptionError
// with ErrInvalidOption, and a client option franz-go refuses wraps
// franz-go's error with ErrInvalidOption. Options that cannot hold together
// with the client's are refused naming both (With: "WithClientOptions"): a
// WithDeadLetterTopic among the consumed topics (ConsumeRegex patterns
// included), a WithRevokeTimeout not below kgo.RebalanceTimeout (default
// 60 s). Without WithRevokeTimeout, the default revoke timeout gives way to
// half a rebalance timeout at or below it.
//
// Options meet by keysched.Option's rule, the one rule of every keysched
// module (see its "How options meet"): the last of a name wins
// (WithClientOptions and WithSchedulerOptions add up instead);
// WithMaxInFlight is the scheduler's key depth, so a keysched.WithMaxPending
// below it applies first, and a WithMaxInFlight above
// keysched.DefaultMaxPending, without keysched.WithMaxPending, raises the
// scheduler's pending bound to it.
type Option func(*config) error

type config struct {
	clientOpts     []kgo.Opt
	schedOpts      []keysched.Option
	ordering       Ordering
	maxInFlight    int
	commitInterval time.Duration
	revokeTimeout  time.Duration
	revokeSet      bool // WithRevokeTimeout given: refused, not lowered, against the rebalance timeout
	dlqTopic       string
	logger         *slog.Logger
	metaMax        int
	maxPoll        int
	meterProvider  metric.MeterProvider // WithMeterProvider (metrics.go)
	meterAttrs     []attribute.KeyValue
}

func defaultConfig() config {
	return config{
		ordering:       KeyOrder,
		maxInFlight:    DefaultMaxInFlight,
		commitInterval: DefaultCommitInterval,
		revokeTimeout:  DefaultRevokeTimeout,
		logger:         slog.Default(),
		metaMax:        DefaultMetadataMaxBytes,
		maxPoll:        DefaultMaxPollRecords,
	}
}

// refused is the *keysched.OptionError of r (nil for nil), with
// ErrInvalidOption for Sentinel: the refusal of an Option of this file.
func refused(r *optcheck.Refusal) error { return opterror.New(ErrInvalidOption, r) }

// WithClientOptions passes franz-go options to the client: seed brokers,
// kgo.ConsumerGroup (required), kgo.ConsumeTopics or kgo.ConsumeRegex
// (required), TLS, SASL, session timeouts, the balancer... The consumer adds
// kgo.DisableAutoCommit, kgo.BlockRebalanceOnPoll and its own
// OnPartitionsAssigned, OnPartitionsRevoked, OnPartitionsLost and
// OnOffsetsFetched callbacks after them (replacing any given here), and
// kgo.WithContext before them: Close ends that context to cut franz-go's
// shutdown short when the broker does not answer (a kgo.WithContext given
// here replaces it, and loses that bound: see CloseMargin). The same
// client produces dead letters. May be given more than once: the lists add up.
func WithClientOptions(opts ...kgo.Opt) Option {
	return func(c *config) error {
		for i, o := range opts {
			if o == nil {
				return refused(optcheck.Refuse("WithClientOptions", nil, "option %d is nil", i))
			}
		}
		c.clientOpts = append(c.clientOpts, opts...)
		return nil
	}
}

// WithSchedulerOptions passes options to the keysched scheduler that runs
// the handlers: keysched.WithWorkers (default keysched.DefaultWorkers),
// keysched.WithRetry, keysched.WithTaskTimeout, keysched.WithFailurePolicy
// (Park makes failed keys wait for Resume or Skip), keysched.WithMaxKeyDepth
// (default: the WithMaxInFlight bound, so that the partition's bound, not the
// key's, pauses fetching), keysched.WithMaxPending, keysched.WithPool,
// keysched.WithLogger (default: WithLogger's). The
// consumer always adds keysched.WithRetryPanics (a panicking handler is a
// failure like any other, retried by the policy) and its own
// keysched.WithDeadLetter and, with WithMeterProvider, its own
// keysched.WithObserver: a keysched.WithDeadLetter or keysched.WithObserver
// given here makes NewConsumer fail with ErrInvalidOption (the scheduler's
// key type is the adapter's own; use WithDeadLetterTopic and
// WithMeterProvider). May be given more than once.
func WithSchedulerOptions(opts ...keysched.Option) Option {
	return func(c *config) error {
		for i, o := range opts {
			if o == nil {
				return refused(optcheck.Refuse("WithSchedulerOptions", nil, "option %d is nil", i))
			}
		}
		c.schedOpts = append(c.schedOpts, opts...)
		return nil
	}
}

// WithOrdering sets which records run one at a time (default KeyOrder).
func WithOrdering(o Ordering) Option {
	return func(c *config) error {
		if r := optcheck.OneOf("WithOrdering", o, "ordering", KeyOrder, PartitionOrder, Unordered); r != nil {
			return refused(r)
		}
		c.ordering = o
		return nil
	}
}

// WithMaxInFlight bounds, per partition, the records fetched and not
// finished (default DefaultMaxInFlight), to n plus one poll
// (WithMaxPollRecords). A partition at the bound is not polled: the poll
// loop waits for it to fall below the bound, and pauses it when it
// finishes no record for 10 ms, or is still at the bound after 100 ms
// (other partitions' records wait meanwhile; when it falls below the bound
// after every poll, it is paused 100 ms after the first of those polls
// while other partitions are owned and fetched records wait in the client,
// so that theirs do not wait behind its whole fetch). A paused partition's fetching
// stops for it alone, and resumes once an eighth of the bound is free (a
// key whose unfinished records fill more than seven eighths of it, a stuck
// one, keeps its partition paused). n >= 1.
func WithMaxInFlight(n int) Option {
	return func(c *config) error {
		if r := optcheck.AtLeast("WithMaxInFlight", n, 1); r != nil {
			return refused(r)
		}
		c.maxInFlight = n
		return nil
	}
}

// WithCommitInterval sets how often the frontiers of owned partitions are
// committed (default DefaultCommitInterval). Commits also happen on revoke
// and on Close. d > 0.
func WithCommitInterval(d time.Duration) Option {
	return func(c *config) error {
		if r := optcheck.Positive("WithCommitInterval", d); r != nil {
			return refused(r)
		}
		c.commitInterval = d
		return nil
	}
}

// WithRevokeTimeout sets how long a revoke waits for the running handlers of
// the partitions it takes away (default DefaultRevokeTimeout), and bounds
// its commit. Handlers still running then have their context cancelled;
// their records are not finished (the next owner handles them). A loss
// (the group dropped the member: another one may own the partitions
// already) cancels them at once. d > 0.
func WithRevokeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if r := optcheck.Positive("WithRevokeTimeout", d); r != nil {
			return refused(r)
		}
		c.revokeTimeout, c.revokeSet = d, true
		return nil
	}
}

// WithDeadLetterTopic makes records that failed for good (retries spent, a
// Permanent error, or Skip of a parked key) be produced to topic, with the
// original key, value and headers plus the headers described in the package
// documentation. A record counts as finished only once that produce is
// acknowledged; a failing produce is retried (backoff 100 ms doubling to
// 10 s) while the key waits, until it succeeds or the partition is taken
// away. Without it, such records are logged at Error and count as finished.
//
// topic must be a name Kafka accepts: 1 to 249 of [a-zA-Z0-9._-], not "."
// or "..". Run checks at its start that the cluster has it, unless the
// client options allow auto topic creation (see Run).
func WithDeadLetterTopic(topic string) Option {
	return func(c *config) error {
		if r := optcheck.Text("WithDeadLetterTopic", topic, maxTopicLen); r != nil {
			return refused(r)
		}
		if r := topicName("WithDeadLetterTopic", topic); r != nil {
			return refused(r)
		}
		c.dlqTopic = topic
		return nil
	}
}

// WithLogger sets where the consumer logs (default slog.Default()). nil is
// an error; use slog.New(slog.DiscardHandler) to silence it.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if r := optcheck.Logger("WithLogger", l); r != nil {
			return refused(r)
		}
		c.logger = l
		return nil
	}
}

// WithCommitMetadataLimit bounds, in bytes, the commit metadata that lists
// the offsets finished above a partition's frontier (default
// DefaultMetadataMaxBytes, the broker's default offset.metadata.max.bytes).
// When the list does not fit, the longest prefix that fits is written, the
// runs nearest the frontier first (and the log says so). 0 never writes
// metadata. n >= 0.
func WithCommitMetadataLimit(n int) Option {
	return func(c *config) error {
		if r := optcheck.AtLeast("WithCommitMetadataLimit", n, 0); r != nil {
			return refused(r)
		}
		c.metaMax = n
		return nil
	}
}

// WithMaxPollRecords bounds the records one poll returns (default
// DefaultMaxPollRecords): with WithMaxInFlight it bounds the records held in
// memory. n >= 1.
func WithMaxPollRecords(n int) Option {
	return func(c *config) error {
		if r := optcheck.AtLeast("WithMaxPollRecords", n, 1); r != nil {
			return refused(r)
		}
		c.maxPoll = n
		return nil
	}
}

// maxTopicLen is the longest topic name Kafka accepts.
const maxTopicLen = 249

// topicName refuses a non-empty topic name Kafka does not accept (its
// Topic.validate): "." or "..", or a character outside [a-zA-Z0-9._-].
func topicName(option, topic string) *optcheck.Refusal {
	if topic == "." || topic == ".." {
		return optcheck.Refuse(option, strconv.Quote(topic), "not a topic name Kafka accepts")
	}
	for _, r := range topic {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '.' || r == '_' || r == '-') {
			return optcheck.Refuse(option, strconv.Quote(topic), "%q is not in a topic name Kafka accepts (letters, digits, '.', '_', '-')", r)
		}
	}
	return nil
}
