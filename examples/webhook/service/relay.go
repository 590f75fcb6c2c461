package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/outbox"
)

// relay runs the outbox's relay with the service's sink: the scheduler key is
// the partner, so one partner's events are delivered one at a time, in
// intake order, and partners in parallel on one pool of Config.Workers.
type relay struct {
	r          *outbox.Relay
	store      *Store
	done       chan struct{}
	runErr     error
	beforeSkip func(partner string) // tests: runs just before the skip's move
}

// schedOpts go to the relay's scheduler (the metrics' observer).
func startRelay(ctx context.Context, s *Service, schedOpts ...keysched.Option) (*relay, error) {
	r, err := s.store.ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
		return s.sink(ctx, e)
	},
		outbox.WithRetry(s.cfg.Retry),
		outbox.WithFailurePolicy(keysched.Park),
		outbox.WithWorkers(s.cfg.Workers),
		// The deliverer bounds each call; this bounds a call plus its wait
		// for a rate token, which the deliverer bounds by the same timeout.
		outbox.WithSinkTimeout(s.cfg.Timeout+time.Second),
		outbox.WithLeaseDuration(s.cfg.LeaseDuration),
		outbox.WithPollInterval(s.cfg.PollInterval),
		outbox.WithOwner(s.cfg.RelayName),
		// Delivered rows are kept for the history's retention: a replay
		// sends their payload again.
		outbox.WithRetention(s.cfg.History),
		// One process per RelayName: a restart after a crash takes the
		// dead process's partners back at once (a live one of the same
		// name would be fenced out; see outbox.WithTakeOverOnStart).
		outbox.WithTakeOverOnStart(),
		outbox.WithLogger(s.log),
		outbox.WithOnDead(func(d outbox.DeadEvent) {
			s.onPark(d.Key, d.ID, d.Attempts, d.Err)
		}),
		outbox.WithSchedulerOptions(schedOpts...),
		// A delivered attempt is recorded in its row's mark (markhook.go).
		outbox.WithMarkHook(s.markHook),
	)
	if err != nil {
		// keysched checks the retry policy: name the Config field.
		if oe := (*keysched.OptionError)(nil); errors.As(err, &oe) && oe.Option == "WithRetry" {
			return nil, fmt.Errorf("%w: Retry: %w", ErrInvalidConfig, oe)
		}
		return nil, fmt.Errorf("webhook: relay: %w", err)
	}
	rl := &relay{r: r, store: s.store, done: make(chan struct{})}
	go func() {
		defer close(rl.done)
		// Run stops at Close; its context is not the caller's, which only
		// bounds New.
		rl.runErr = r.Run(context.WithoutCancel(ctx))
	}()
	return rl, nil
}

func (rl *relay) parked(ctx context.Context) ([]string, error) { return rl.r.Parked(ctx) }

func (rl *relay) resume(ctx context.Context, partner string) error {
	err := rl.r.Resume(ctx, partner)
	if errors.Is(err, outbox.ErrNotParked) {
		return fmt.Errorf("%w: %q", ErrNotParked, partner)
	}
	return closedAs(err)
}

// closedAs makes the relay's ErrClosed (a Close that began after the
// action's own check) the service's ErrClosed too.
func closedAs(err error) error {
	if errors.Is(err, outbox.ErrClosed) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

// skip gives up the partner's head (its oldest dead row) only if it is the
// row head: outbox's SkipEvent checks and moves in one statement. (Skip
// asked the outbox to skip "the oldest dead row": if the head the operator
// saw was resumed, delivered and the next event died in between, the outbox
// skipped that next event, one the operator never saw.)
func (rl *relay) skip(ctx context.Context, partner, head string) error {
	if rl.beforeSkip != nil {
		rl.beforeSkip(partner)
	}
	err := rl.r.SkipEvent(ctx, partner, head)
	var hc *outbox.HeadChangedError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &hc):
		// The head may be a replay (its own delivery ID): an operator
		// who sent the replayed event's ID is told which ID to send.
		// Skip does not take the event's ID for its replay: with several
		// replays of one event, or the replay delivered and a later one
		// parked meanwhile, it could give up a delivery never seen.
		if of, ok, rerr := rl.store.replayOf(ctx, hc.Head); rerr == nil && ok {
			if of == head {
				return fmt.Errorf("%w: partner %q: its head is %q, a replay of event %q (a replay has its own delivery ID), not the event itself: nothing was skipped; to give up this replay, send event=%s", ErrHeadChanged, partner, hc.Head, head, hc.Head)
			}
			return fmt.Errorf("%w: partner %q: its head is now %q, a replay of event %q, not %q: nothing was skipped (look again, then decide; to give up that replay, send event=%s)", ErrHeadChanged, partner, hc.Head, of, head, hc.Head)
		}
		return fmt.Errorf("%w: partner %q: its head is now %q, not %q: nothing was skipped (look again, then decide)", ErrHeadChanged, partner, hc.Head, head)
	case errors.Is(err, outbox.ErrNotParked):
		return fmt.Errorf("%w: %q: nothing was skipped", ErrNotParked, partner)
	case errors.Is(err, outbox.ErrInvalidID):
		return fmt.Errorf("%w: %w", ErrUnknownEvent, err)
	}
	return closedAs(err)
}

// close stops the relay: deliveries in flight finish until ctx ends (then
// they are cancelled and their rows stay pending for the next start).
func (rl *relay) close(ctx context.Context) error {
	err := rl.r.Close(ctx)
	<-rl.done
	if errors.Is(rl.runErr, outbox.ErrClosed) {
		rl.runErr = nil
	}
	return errors.Join(err, rl.runErr)
}

func (rl *relay) scheduler() *keysched.Scheduler[string] { return rl.r.Scheduler() }
