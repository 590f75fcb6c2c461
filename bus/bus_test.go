package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/keysched/keysched"
	"github.com/panjf2000/ants/v2"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The ants package starts its default pool's goroutines at init: they are
// not ours.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreCurrent()) }

// guard bounds every wait in these tests: a deadlock fails the test instead
// of hanging it. It is never a timing assertion.
const guard = 10 * time.Second

var quiet = slog.New(slog.DiscardHandler)

func newBus[K comparable](t testing.TB, opts ...Option) *Bus[K] {
	t.Helper()
	b, err := New[K](append([]Option{WithLogger(quiet)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		_ = b.Close(ctx)
	})
	return b
}

func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(guard):
		t.Fatalf("no %s within %v: deadlock?", what, guard)
		var zero T
		return zero
	}
}

// gate returns a channel that blocked handlers wait on, and its release.
// Call it after newBus: cleanups run last-in first-out, so a test that fails
// early still releases its handlers before the bus's Close.
func gate(t testing.TB) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	return ch, release
}

func guardCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	t.Cleanup(cancel)
	return ctx
}

type tick struct{ N int }

type order struct {
	ID    string
	Total int
}

func TestPublishSubscribeBasics(t *testing.T) {
	ctx := guardCtx(t)
	b := newBus[string](t, WithWorkers(2))
	got := make(chan Envelope[string], 10)
	sub, err := Subscribe(b, "ticks", func(ctx context.Context, env Envelope[string], ev tick) error {
		require.Equal(t, 1, keysched.Attempt(ctx))
		got <- env
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, "ticks", sub.Name())

	before := time.Now()
	require.NoError(t, b.Publish(ctx, "k", tick{N: 7}))
	env := recv(t, got, "delivery")
	require.Equal(t, "k", env.Key)
	require.Equal(t, tick{N: 7}, env.Event)
	id, err := uuid.Parse(env.ID)
	require.NoError(t, err, "a generated ID is a UUID")
	require.Equal(t, uuid.Version(7), id.Version())
	require.False(t, env.Published.Before(before))

	// An event nobody subscribes to is counted, not an error.
	require.NoError(t, b.Publish(ctx, "k", "a string"))
	require.ErrorIs(t, b.Publish(ctx, "k", nil), ErrNilEvent)
	require.NoError(t, b.Drain(ctx))
	st := b.Stats()
	require.Equal(t, Stats{Subscribers: 1, Published: 2, Unmatched: 1}, st)
	ss := sub.Stats()
	require.EqualValues(t, 1, ss.Delivered)
	require.EqualValues(t, 1, ss.Submitted)
	require.EqualValues(t, 1, ss.Succeeded)
	require.Equal(t, []string{"ticks"}, b.Subscriptions())
}

type named interface{ Name() string }

type user struct{ N string }

func (u user) Name() string { return u.N }

type team struct{ N string }

func (t *team) Name() string { return t.N }

func TestRoutingByDynamicType(t *testing.T) {
	ctx := guardCtx(t)
	b := newBus[int](t, WithWorkers(2))
	var mu sync.Mutex
	seen := map[string][]any{}
	record := func(name string) func(any) {
		return func(ev any) { mu.Lock(); seen[name] = append(seen[name], ev); mu.Unlock() }
	}
	users, teams, nameds, all := record("user"), record("*team"), record("named"), record("any")
	_, err := Subscribe(b, "user", func(_ context.Context, _ Envelope[int], ev user) error { users(ev); return nil })
	require.NoError(t, err)
	_, err = Subscribe(b, "*team", func(_ context.Context, _ Envelope[int], ev *team) error { teams(ev); return nil })
	require.NoError(t, err)
	_, err = Subscribe(b, "named", func(_ context.Context, _ Envelope[int], ev named) error { nameds(ev); return nil })
	require.NoError(t, err)
	_, err = Subscribe(b, "any", func(_ context.Context, _ Envelope[int], ev any) error { all(ev); return nil })
	require.NoError(t, err)

	u, tm := user{"u"}, &team{"t"}
	require.NoError(t, b.Publish(ctx, 1, u))
	require.NoError(t, b.Publish(ctx, 1, tm))
	require.NoError(t, b.Publish(ctx, 1, team{"value"})) // team (not *team) has no Name method
	require.NoError(t, b.Publish(ctx, 1, 42))
	require.NoError(t, b.Drain(ctx))

	require.Equal(t, []any{u}, seen["user"])
	require.Equal(t, []any{tm}, seen["*team"])
	require.Equal(t, []any{u, tm}, seen["named"])
	require.Equal(t, []any{u, tm, team{"value"}, 42}, seen["any"])
	require.EqualValues(t, 0, b.Stats().Unmatched)
}

// Property 2: a subscriber blocked forever on key k delays nobody, not even
// the other subscribers of k.
func TestStuckSubscriberDelaysNobody(t *testing.T) {
	ctx := guardCtx(t)
	b := newBus[string](t, WithWorkers(4))
	released, release := gate(t)
	stuckOnK := make(chan struct{}, 1)
	stuckOther := make(chan int, 100)
	_, err := Subscribe(b, "stuck", func(_ context.Context, env Envelope[string], ev tick) error {
		if env.Key == "k" {
			select {
			case stuckOnK <- struct{}{}:
			default:
			}
			<-released // ignores its context: blocked until the test ends
			return nil
		}
		stuckOther <- ev.N
		return nil
	})
	require.NoError(t, err)
	got := make(chan tick, 1000)
	_, err = Subscribe(b, "other", func(_ context.Context, env Envelope[string], ev tick) error {
		if env.Key == "k" {
			got <- ev
		}
		return nil
	})
	require.NoError(t, err)

	const n = 200 // below the default MaxKeyDepth: Block never waits here
	require.NoError(t, b.Publish(ctx, "k", tick{0}))
	recv(t, stuckOnK, "stuck handler start")
	for i := 1; i < n; i++ {
		require.NoError(t, b.Publish(ctx, "k", tick{i}))
	}
	for i := range n {
		require.Equal(t, tick{i}, recv(t, got, "other's event of k"), "other gets k's events in order")
	}
	// The stuck subscriber's other keys go on too.
	require.NoError(t, b.Publish(ctx, "j", tick{-1}))
	require.Equal(t, -1, recv(t, stuckOther, "stuck's event of another key"))

	release()
	require.NoError(t, b.Drain(ctx))
}

// While Publish waits for a full Block subscriber, the others already have
// the event.
func TestBlockWaitsAfterOffering(t *testing.T) {
	ctx := guardCtx(t)
	b := newBus[string](t, WithWorkers(4))
	step := make(chan struct{})
	t.Cleanup(func() { close(step) })
	running := make(chan struct{}, 1)
	full, err := Subscribe(b, "full", func(context.Context, Envelope[string], tick) error {
		running <- struct{}{}
		<-step
		return nil
	}, MaxKeyDepth(1))
	require.NoError(t, err)
	got := make(chan tick, 10)
	_, err = Subscribe(b, "other", func(_ context.Context, _ Envelope[string], ev tick) error { got <- ev; return nil })
	require.NoError(t, err)

	require.NoError(t, b.Publish(ctx, "k", tick{1}))
	recv(t, running, "first event running")
	require.Equal(t, tick{1}, recv(t, got, "first event"))

	published := make(chan error, 1)
	go func() { published <- b.Publish(ctx, "k", tick{2}) }()
	require.Equal(t, tick{2}, recv(t, got, "second event at the other subscriber"))
	select {
	case err := <-published:
		t.Fatalf("Publish returned (%v) while the Block subscriber was full", err)
	default:
	}
	step <- struct{}{} // the first event finishes: room for the second
	require.NoError(t, recv(t, published, "Publish"))
	recv(t, running, "second event running")
	step <- struct{}{}
	require.NoError(t, b.Drain(ctx))
	require.EqualValues(t, 2, full.Stats().Delivered)

	// A Block subscriber whose wait outlives Publish's context refuses.
	hold, _ := gate(t)
	_, err = Subscribe(b, "held", func(context.Context, Envelope[string], order) error { <-hold; return nil }, MaxKeyDepth(1))
	require.NoError(t, err)
	require.NoError(t, b.Publish(ctx, "k", order{ID: "1"}))
	waiting, cancel := context.WithCancel(ctx)
	sc := &signalCtx{Context: waiting, asked: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- b.Publish(sc, "k", order{ID: "2"}) }()
	recv(t, sc.asked, "Publish waiting on its context") // it waits for room now
	cancel()
	err = recv(t, done, "Publish after its context ended")
	var pe *PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Refused, 1)
	require.ErrorIs(t, pe.Refused["held"], keysched.ErrKeyFull)
	require.ErrorIs(t, err, context.Canceled)
}

// signalCtx closes asked the first time somebody asks for its Done channel:
// a waiter has started waiting on it.
type signalCtx struct {
	context.Context
	asked chan struct{}
	once  sync.Once
}

func (c *signalCtx) Done() <-chan struct{} {
	c.once.Do(func() { close(c.asked) })
	return c.Context.Done()
}

// Property 3: the bulkhead. A slow subscriber with MaxConcurrency(2) never
// runs more than 2 handlers, and the other subscriber gets every event while
// the slow one holds its 2 workers. (Throughput: BenchmarkBulkhead.)
func TestBulkhead(t *testing.T) {
	ctx := guardCtx(t)
	const workers, keys = 4, 50
	b := newBus[int](t, WithWorkers(workers))
	released, release := gate(t)
	entered := make(chan struct{}, keys*10)
	var cur, peak atomic.Int32
	slow, err := Subscribe(b, "slow", func(context.Context, Envelope[int], tick) error {
		n := cur.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		entered <- struct{}{}
		<-released
		cur.Add(-1)
		return nil
	}, MaxConcurrency(2))
	require.NoError(t, err)
	fastDone := make(chan int, keys*10)
	fast, err := Subscribe(b, "fast", func(_ context.Context, env Envelope[int], _ tick) error {
		fastDone <- env.Key
		return nil
	})
	require.NoError(t, err)

	for i := range keys * 10 {
		require.NoError(t, b.Publish(ctx, i%keys, tick{i}))
	}
	recv(t, entered, "slow handler 1")
	recv(t, entered, "slow handler 2")
	for range keys * 10 {
		recv(t, fastDone, "fast subscriber's event")
	}
	require.EqualValues(t, 2, peak.Load(), "the slow subscriber runs at most 2 handlers")
	require.NoError(t, fast.Drain(ctx), "the fast subscriber finishes while the slow one holds its 2 workers")
	require.EqualValues(t, keys*10, fast.Stats().Delivered)
	require.EqualValues(t, 2, slow.Stats().Running)
	require.EqualValues(t, keys*10, slow.Stats().Pending, "the slow subscriber's other events wait, holding no worker")
	require.EqualValues(t, 2, peak.Load())

	release()
	require.NoError(t, b.Drain(ctx))
	require.EqualValues(t, 2, peak.Load())
	require.EqualValues(t, keys*10, slow.Stats().Delivered)
}

// Property 5: Reject and DropNewest refuse for their subscriber only, and
// say so.
func TestRejectAndDropNewest(t *testing.T) {
	ctx := guardCtx(t)
	b := newBus[string](t, WithWorkers(4))
	released, release := gate(t)
	blocker := func(context.Context, Envelope[string], tick) error { <-released; return nil }
	// Bulkheads: the two blocked subscribers hold at most one worker each,
	// the "ok" subscriber keeps the other two (without them the blocked
	// handlers of keys k and j could hold all four).
	rej, err := Subscribe(b, "rejecter", blocker, MaxKeyDepth(1), OnFull(Reject), MaxConcurrency(1))
	require.NoError(t, err)
	drop, err := Subscribe(b, "dropper", blocker, MaxKeyDepth(2), OnFull(DropNewest), MaxConcurrency(1))
	require.NoError(t, err)
	got := make(chan tick, 10)
	ok, err := Subscribe(b, "ok", func(_ context.Context, _ Envelope[string], ev tick) error { got <- ev; return nil })
	require.NoError(t, err)

	require.NoError(t, b.Publish(ctx, "k", tick{1})) // every subscriber takes it
	err = b.Publish(ctx, "k", tick{2})               // the rejecter is full (depth 1)
	var pe *PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Refused, 1)
	require.ErrorIs(t, pe.Refused["rejecter"], keysched.ErrKeyFull)
	require.ErrorIs(t, err, keysched.ErrKeyFull)
	require.NotErrorIs(t, err, ErrDropped)

	err = b.Publish(ctx, "k", tick{3}) // now the dropper is full too (depth 2)
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Refused, 2)
	require.ErrorIs(t, pe.Refused["rejecter"], keysched.ErrKeyFull)
	require.ErrorIs(t, pe.Refused["dropper"], ErrDropped)
	require.ErrorIs(t, pe.Refused["dropper"], keysched.ErrKeyFull)
	require.Equal(t, fmt.Sprintf("bus: publish refused by 2 subscriber(s): %q: %v; %q: %v",
		"dropper", pe.Refused["dropper"], "rejecter", pe.Refused["rejecter"]), err.Error())
	require.Len(t, pe.Unwrap(), 2)

	// Another key is not full for anyone.
	require.NoError(t, b.Publish(ctx, "j", tick{4}))

	seen := map[int]bool{}
	for range 4 {
		seen[recv(t, got, "the unaffected subscriber's event").N] = true
	}
	require.Equal(t, map[int]bool{1: true, 2: true, 3: true, 4: true}, seen)
	release()
	require.NoError(t, b.Drain(ctx))
	require.EqualValues(t, 1, drop.Stats().Dropped)
	require.EqualValues(t, 0, drop.Stats().Rejected)
	require.EqualValues(t, 3, drop.Stats().Delivered) // 1, 2, 4
	require.EqualValues(t, 2, rej.Stats().Rejected)
	require.EqualValues(t, 0, rej.Stats().Dropped)
	require.EqualValues(t, 2, rej.Stats().Delivered) // 1, 4
	require.EqualValues(t, 4, ok.Stats().Delivered)
}

// Property 5: dead letters carry the ID, headers and payload.
func TestDeadLetterCarriesEnvelope(t *testing.T) {
	ctx := guardCtx(t)
	b := newBus[string](t, WithWorkers(2))
	boom := errors.New("boom")
	dls := make(chan DeadLetter[string], 10)
	sub, err := Subscribe(b, "billing", func(context.Context, Envelope[string], order) error {
		return keysched.Permanent(boom)
	}, DeadLetters(func(dl DeadLetter[string]) { dls <- dl }))
	require.NoError(t, err)

	env := Envelope[string]{
		ID:      "evt-1",
		Key:     "acct-9",
		Event:   order{ID: "o-1", Total: 42},
		Headers: map[string]string{"correlation-id": "c-77"},
	}
	require.NoError(t, b.PublishEnvelope(ctx, env))
	dl := recv(t, dls, "dead letter")
	require.Equal(t, "billing", dl.Subscriber)
	require.Equal(t, "evt-1", dl.Envelope.ID)
	require.Equal(t, "acct-9", dl.Envelope.Key)
	require.Equal(t, order{ID: "o-1", Total: 42}, dl.Envelope.Event)
	require.Equal(t, map[string]string{"correlation-id": "c-77"}, dl.Envelope.Headers)
	require.False(t, dl.Envelope.Published.IsZero())
	require.Equal(t, 1, dl.Attempts)
	require.ErrorIs(t, dl.Err, boom)
	require.False(t, dl.FirstAttempt.IsZero())
	require.Equal(t, dl.FirstAttempt, dl.LastAttempt)

	// A dead letter can be replayed as it is.
	require.NoError(t, b.PublishEnvelope(ctx, dl.Envelope))
	require.Equal(t, "evt-1", recv(t, dls, "replayed dead letter").Envelope.ID)
	require.NoError(t, b.Drain(ctx))
	st := sub.Stats()
	require.EqualValues(t, 2, st.Failed)
	require.EqualValues(t, 2, st.DeadLettered)
	require.EqualValues(t, 0, st.Delivered)

	// A panic in the dead-letter function is recovered.
	_, err = Subscribe(b, "panicky", func(context.Context, Envelope[string], order) error {
		return errors.New("fail")
	}, DeadLetters(func(DeadLetter[string]) { panic("dead-letter bug") }))
	require.NoError(t, err)
	require.NoError(t, b.Publish(ctx, "k", order{}))
	<-dls // billing's
	require.NoError(t, b.Drain(ctx))
}

func TestRetryIsAtLeastOnce(t *testing.T) {
	ctx := guardCtx(t)
	b := newBus[string](t, WithWorkers(2))
	var calls atomic.Int32
	dls := make(chan DeadLetter[string], 1)
	sub, err := Subscribe(b, "flaky", func(ctx context.Context, env Envelope[string], _ tick) error {
		calls.Add(1)
		return fmt.Errorf("attempt %d failed", keysched.Attempt(ctx))
	}, Retry(keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Microsecond}),
		DeadLetters(func(dl DeadLetter[string]) { dls <- dl }))
	require.NoError(t, err)
	require.NoError(t, b.PublishEnvelope(ctx, Envelope[string]{ID: "r-1", Key: "k", Event: tick{1}}))
	dl := recv(t, dls, "dead letter")
	require.Equal(t, 3, dl.Attempts)
	require.EqualError(t, dl.Err, "attempt 3 failed")
	require.Equal(t, "r-1", dl.Envelope.ID)
	require.True(t, dl.LastAttempt.After(dl.FirstAttempt) || dl.LastAttempt.Equal(dl.FirstAttempt))
	require.NoError(t, b.Drain(ctx))
	require.EqualValues(t, 3, calls.Load())
	require.EqualValues(t, 2, sub.Stats().Retried)

	_, err = Subscribe(b, "bad-retry", func(context.Context, Envelope[string], tick) error { return nil },
		Retry(keysched.RetryPolicy{MaxAttempts: 3}))
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
}

// Property 5: Dedup skips envelope IDs it handled recently, and does not
// skip a retry of a failed attempt.
func TestDedup(t *testing.T) {
	ctx := guardCtx(t)
	b := newBus[string](t, WithWorkers(2))
	var mu sync.Mutex
	var calls []string
	failOnce := map[string]bool{"z": true}
	h := func(_ context.Context, env Envelope[string], _ tick) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, env.ID)
		if failOnce[env.ID] {
			failOnce[env.ID] = false
			return errors.New("transient")
		}
		return nil
	}
	once, err := Dedup(h, 2)
	require.NoError(t, err)
	sub, err := Subscribe(b, "once", once,
		Retry(keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Microsecond}))
	require.NoError(t, err)
	for _, id := range []string{"x", "x", "y", "x", "z", "z", "w", "v", "x"} {
		require.NoError(t, b.PublishEnvelope(ctx, Envelope[string]{ID: id, Key: "k", Event: tick{}}))
	}
	require.NoError(t, b.Drain(ctx))
	// window 2: x is forgotten after z and w; z's failed attempt is retried.
	require.Equal(t, []string{"x", "y", "z", "z", "w", "v", "x"}, calls)
	require.EqualValues(t, 9, sub.Stats().Delivered)
}

// Property 6: a handler that publishes, on a one-worker pool, never
// deadlocks: with the handler's context Publish fails fast instead of
// waiting, even for the handler's own, full key.
func TestHandlerPublishesOnOneWorker(t *testing.T) {
	before := goleak.IgnoreCurrent()
	ctx := guardCtx(t)
	b, err := New[int](WithWorkers(1), WithLogger(quiet))
	require.NoError(t, err)
	type ping struct{ N int }
	ownKeyErrs := make(chan error, 100)
	relay, err := Subscribe(b, "relay", func(ctx context.Context, env Envelope[int], p ping) error {
		if p.N == 0 {
			return nil
		}
		// The handler's own key is full (MaxKeyDepth 1, this event holds
		// it): a blocking Publish from outside would wait for this very
		// handler. With the handler's context it fails at once.
		ownKeyErrs <- b.Publish(ctx, env.Key, ping{p.N - 1})
		return b.Publish(ctx, env.Key+1, ping{p.N - 1})
	}, MaxKeyDepth(1))
	require.NoError(t, err)
	var sinkGot atomic.Int32
	_, err = Subscribe(b, "sink", func(context.Context, Envelope[int], ping) error {
		sinkGot.Add(1)
		return nil
	}, MaxKeyDepth(1))
	require.NoError(t, err)
	// Drain, Close and Unsubscribe refuse a handler's context.
	inside := make(chan [3]error, 1)
	_, err = Subscribe(b, "inside", func(ctx context.Context, _ Envelope[int], _ string) error {
		inside <- [3]error{b.Drain(ctx), b.Close(ctx), relay.Unsubscribe(ctx)}
		return nil
	})
	require.NoError(t, err)

	const depth = 20
	require.NoError(t, b.Publish(ctx, 0, ping{depth}))
	require.NoError(t, b.Publish(ctx, 0, "inside"))
	require.NoError(t, b.Drain(ctx))
	for range depth {
		err := recv(t, ownKeyErrs, "own-key publish result")
		var pe *PublishError
		require.ErrorAs(t, err, &pe)
		require.ErrorIs(t, pe.Refused["relay"], keysched.ErrKeyFull)
	}
	for _, err := range recv(t, inside, "inside calls") {
		require.ErrorIs(t, err, keysched.ErrInsideTask)
	}
	require.EqualValues(t, depth+1, relay.Stats().Delivered)
	require.GreaterOrEqual(t, sinkGot.Load(), int32(depth+1))

	require.NoError(t, b.Close(ctx))
	goleak.VerifyNone(t, before)
}

func TestCloseRefusesAndReportsWhatDidNotRun(t *testing.T) {
	ctx := guardCtx(t)
	b, err := New[string](WithWorkers(2), WithLogger(quiet))
	require.NoError(t, err)
	released, release := gate(t)
	started := make(chan struct{})
	dls := make(chan DeadLetter[string], 10)
	delivered := make(chan string, 10)
	// One handler at a time: the first blocks (ignoring its context), so the
	// events of the other keys are still queued when Close gives up.
	_, err = Subscribe(b, "stuck", func(ctx context.Context, env Envelope[string], ev tick) error {
		if ev.N == 0 {
			close(started)
			<-released
		}
		delivered <- env.ID
		return nil
	}, MaxConcurrency(1), DeadLetters(func(dl DeadLetter[string]) { dls <- dl }))
	require.NoError(t, err)
	for i := range 4 {
		env := Envelope[string]{ID: fmt.Sprint("e", i), Key: fmt.Sprint("k", i), Event: tick{i},
			Headers: map[string]string{"n": fmt.Sprint(i)}}
		require.NoError(t, b.PublishEnvelope(ctx, env))
	}
	recv(t, started, "first handler")
	ended, cancel := context.WithCancel(ctx)
	cancel()
	err = b.Close(ended)
	require.ErrorIs(t, err, keysched.ErrAborted)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, `subscriber "stuck"`)
	for range 3 {
		dl := recv(t, dls, "dead letter")
		require.ErrorIs(t, dl.Err, keysched.ErrAborted)
		require.Zero(t, dl.Attempts)
		require.Equal(t, "stuck", dl.Subscriber)
		n := dl.Envelope.Event.(tick).N
		require.NotZero(t, n)
		require.Equal(t, fmt.Sprint("e", n), dl.Envelope.ID)
		require.Equal(t, fmt.Sprint("k", n), dl.Envelope.Key)
		require.Equal(t, map[string]string{"n": fmt.Sprint(n)}, dl.Envelope.Headers)
	}
	require.ErrorIs(t, b.Publish(ctx, "k", tick{}), ErrClosed)
	_, err = Subscribe(b, "late", func(context.Context, Envelope[string], tick) error { return nil })
	require.ErrorIs(t, err, ErrClosed)
	require.Equal(t, b.Close(ctx), b.Close(ctx), "Close is idempotent")

	release() // the handler that ignored its context finishes after all
	require.Equal(t, "e0", recv(t, delivered, "the blocked handler's return"))
	require.Empty(t, dls)
}

func TestCloseDrainsEverySubscriber(t *testing.T) {
	before := goleak.IgnoreCurrent()
	ctx := guardCtx(t)
	b, err := New[int](WithWorkers(3), WithLogger(quiet))
	require.NoError(t, err)
	var a, c atomic.Int32
	_, err = Subscribe(b, "a", func(context.Context, Envelope[int], tick) error { a.Add(1); return nil })
	require.NoError(t, err)
	_, err = Subscribe(b, "c", func(context.Context, Envelope[int], tick) error { c.Add(1); return nil }, MaxConcurrency(1))
	require.NoError(t, err)
	for i := range 500 {
		require.NoError(t, b.Publish(ctx, i%7, tick{i}))
	}
	require.NoError(t, b.Close(ctx))
	require.EqualValues(t, 500, a.Load())
	require.EqualValues(t, 500, c.Load())
	goleak.VerifyNone(t, before)
}

func TestSharedPoolIsNotReleased(t *testing.T) {
	ctx := guardCtx(t)
	p, err := ants.NewPool(2)
	require.NoError(t, err)
	defer p.Release()
	_, err = New[int](WithPool(p), WithWorkers(2))
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	b, err := New[int](WithPool(p), WithLogger(quiet))
	require.NoError(t, err)
	var n atomic.Int32
	_, err = Subscribe(b, "a", func(context.Context, Envelope[int], tick) error { n.Add(1); return nil })
	require.NoError(t, err)
	require.NoError(t, b.Publish(ctx, 1, tick{}))
	require.NoError(t, b.Close(ctx))
	require.EqualValues(t, 1, n.Load())
	require.False(t, p.IsClosed())
}

func TestUnsubscribe(t *testing.T) {
	ctx := guardCtx(t)
	b := newBus[int](t, WithWorkers(2))
	var n atomic.Int32
	h := func(context.Context, Envelope[int], tick) error { n.Add(1); return nil }
	sub, err := Subscribe(b, "a", h)
	require.NoError(t, err)
	_, err = Subscribe(b, "a", h)
	require.ErrorIs(t, err, ErrDuplicateName)
	require.NoError(t, b.Publish(ctx, 1, tick{}))
	require.NoError(t, sub.Unsubscribe(ctx))
	require.NoError(t, sub.Unsubscribe(ctx), "idempotent")
	require.EqualValues(t, 1, n.Load(), "Unsubscribe waited for the accepted event")
	require.NoError(t, b.Publish(ctx, 1, tick{}))
	require.EqualValues(t, 1, b.Stats().Unmatched)
	require.EqualValues(t, 1, n.Load())
	sub2, err := Subscribe(b, "a", h)
	require.NoError(t, err, "the name is free again")
	require.NoError(t, b.Publish(ctx, 1, tick{}))
	require.NoError(t, sub2.Drain(ctx))
	require.EqualValues(t, 2, n.Load())
}

func TestSubscribeErrors(t *testing.T) {
	b := newBus[string](t, WithWorkers(1))
	ok := func(context.Context, Envelope[string], tick) error { return nil }
	cases := []struct {
		name string
		sub  func() (*Subscription[string], error)
	}{
		{"empty name", func() (*Subscription[string], error) { return Subscribe(b, "", ok) }},
		{"nil handler", func() (*Subscription[string], error) { return Subscribe[string, tick](b, "x", nil) }},
		{"nil bus", func() (*Subscription[string], error) { return Subscribe[string](nil, "x", ok) }},
		{"nil option", func() (*Subscription[string], error) { return Subscribe(b, "x", ok, nil) }},
		{"MaxConcurrency 0", func() (*Subscription[string], error) { return Subscribe(b, "x", ok, MaxConcurrency(0)) }},
		{"MaxKeyDepth 0", func() (*Subscription[string], error) { return Subscribe(b, "x", ok, MaxKeyDepth(0)) }},
		{"MaxPending -1", func() (*Subscription[string], error) { return Subscribe(b, "x", ok, MaxPending(-1)) }},
		{"OnFull 9", func() (*Subscription[string], error) { return Subscribe(b, "x", ok, OnFull(9)) }},
		{"Failure 9", func() (*Subscription[string], error) { return Subscribe(b, "x", ok, Failure(9)) }},
		{"Timeout 0", func() (*Subscription[string], error) { return Subscribe(b, "x", ok, Timeout(0)) }},
		{"EjectAfter 0", func() (*Subscription[string], error) { return Subscribe(b, "x", ok, EjectAfter(0), Timeout(1)) }},
		{"EjectAfter without Timeout", func() (*Subscription[string], error) { return Subscribe(b, "x", ok, EjectAfter(1)) }},
		{"DeadLetters nil", func() (*Subscription[string], error) { return Subscribe(b, "x", ok, DeadLetters[string](nil)) }},
		{"DeadLetters wrong key type", func() (*Subscription[string], error) {
			return Subscribe(b, "x", ok, DeadLetters(func(DeadLetter[int]) {}))
		}},
		{"bad retry", func() (*Subscription[string], error) {
			return Subscribe(b, "x", ok, Retry(keysched.RetryPolicy{MaxAttempts: -1}))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := c.sub()
			require.Nil(t, s)
			require.ErrorIs(t, err, keysched.ErrInvalidOption)
		})
	}
	require.Empty(t, b.Subscriptions(), "no failed Subscribe registered anything")
	_, err := New[int](WithWorkers(0))
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	_, err = New[int](nil)
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	_, err = New[int](WithLogger(nil))
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	_, err = New[int](WithPool(nil))
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
	require.Equal(t, "DropNewest", DropNewest.String())
	require.Equal(t, "OverflowPolicy(7)", OverflowPolicy(7).String())
}

func TestPublishErrors(t *testing.T) {
	ctx := guardCtx(t)
	b := newBus[any](t, WithWorkers(1))
	_, err := Subscribe(b, "a", func(context.Context, Envelope[any], tick) error { return nil })
	require.NoError(t, err)
	//nolint:staticcheck // a nil context on purpose
	require.ErrorIs(t, b.Publish(nil, 1, tick{}), keysched.ErrNilContext)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, b.Publish(ended, 1, tick{}), context.Canceled)
	err = b.Publish(ctx, []int{1}, tick{}) // a key unusable as a map key
	require.ErrorIs(t, err, keysched.ErrInvalidKey)
	var pe *PublishError
	require.False(t, errors.As(err, &pe))
	require.NoError(t, b.Drain(ctx))
}

// Park: a failed event stops its key for this subscriber only, until
// Resume or Skip.
func TestParkResumeSkip(t *testing.T) {
	ctx := guardCtx(t)
	b := newBus[string](t, WithWorkers(2))
	var mu sync.Mutex
	fail := map[int]bool{1: true, 2: true}
	var got []int
	sub, err := Subscribe(b, "parker", func(_ context.Context, _ Envelope[string], ev tick) error {
		mu.Lock()
		defer mu.Unlock()
		if fail[ev.N] {
			return errors.New("not yet")
		}
		got = append(got, ev.N)
		return nil
	}, Failure(keysched.Park), DeadLetters(func(DeadLetter[string]) {}))
	require.NoError(t, err)
	for i := 1; i <= 3; i++ {
		require.NoError(t, b.Publish(ctx, "k", tick{i}))
	}
	require.Eventually(t, func() bool { return len(sub.Parked()) == 1 }, guard, time.Millisecond)
	require.Equal(t, []string{"k"}, sub.Parked()) // typed: a key of another type does not compile
	require.ErrorIs(t, sub.Skip("nope"), keysched.ErrNotParked)
	mu.Lock()
	fail[1] = false
	mu.Unlock()
	require.NoError(t, sub.Resume("k")) // 1 now succeeds; 2 fails and parks again
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 1 && len(sub.Parked()) == 1
	}, guard, time.Millisecond)
	require.NoError(t, sub.Skip("k")) // give 2 up; 3 runs
	require.NoError(t, b.Drain(ctx))
	require.Equal(t, []int{1, 3}, got)
}

// Resume and Skip refuse a key that cannot be a map key, and report
// keysched.ErrClosed once Unsubscribe has given up on a parked key.
func TestResumeSkipErrors(t *testing.T) {
	ctx := guardCtx(t)
	b := newBus[any](t, WithWorkers(1))
	parked := make(chan struct{}, 1)
	sub, err := Subscribe(b, "parker", func(context.Context, Envelope[any], tick) error {
		return errors.New("down")
	}, Failure(keysched.Park), DeadLetters(func(dl DeadLetter[any]) {
		if !errors.Is(dl.Err, keysched.ErrAborted) {
			parked <- struct{}{}
		}
	}))
	require.NoError(t, err)
	require.ErrorIs(t, sub.Resume([]int{1}), keysched.ErrInvalidKey)
	require.ErrorIs(t, sub.Skip(math.NaN()), keysched.ErrInvalidKey)
	require.ErrorIs(t, sub.Skip("k"), keysched.ErrNotParked)

	require.NoError(t, b.Publish(ctx, "k", tick{1}))
	<-parked
	require.Equal(t, []any{"k"}, sub.Parked())
	gaveUp, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, sub.Unsubscribe(gaveUp), keysched.ErrAborted)
	require.Empty(t, sub.Parked())
	require.ErrorIs(t, sub.Resume("k"), keysched.ErrClosed)
	require.ErrorIs(t, sub.Skip("k"), keysched.ErrClosed)
}

func TestPublishErrorUnwrapOrder(t *testing.T) {
	a, c := errors.New("a"), errors.New("c")
	pe := &PublishError{Refused: map[string]error{"zz": c, "aa": a}}
	require.Equal(t, []error{a, c}, pe.Unwrap())
	require.ErrorIs(t, pe, a)
	require.ErrorIs(t, pe, c)
	require.Equal(t, `bus: publish refused by 2 subscriber(s): "aa": a; "zz": c`, pe.Error())
}

// Close's abort racing a runner that moves the key on: every event that did
// not run is dead-lettered once, with its envelope.
func TestCloseAbortDeadLettersCarryEnvelopes(t *testing.T) {
	ctx := guardCtx(t)
	b, err := New[string](WithWorkers(1), WithLogger(quiet))
	require.NoError(t, err)
	started := make(chan struct{})
	dls := make(chan DeadLetter[string], 100)
	var ran atomic.Int32
	_, err = Subscribe(b, "s", func(ctx context.Context, env Envelope[string], ev tick) error {
		ran.Add(1)
		if ev.N == 0 {
			close(started)
			<-ctx.Done() // respects its context: Close's abort cancels it
			return ctx.Err()
		}
		return nil
	}, DeadLetters(func(dl DeadLetter[string]) { dls <- dl }))
	require.NoError(t, err)
	const n = 20
	for i := range n {
		require.NoError(t, b.PublishEnvelope(ctx, Envelope[string]{ID: fmt.Sprint("e", i), Key: "k", Event: tick{i}}))
	}
	recv(t, started, "first handler")
	ended, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, b.Close(ended), keysched.ErrAborted)
	require.Eventually(t, func() bool { return int(ran.Load())+len(dls) == n+1 }, guard, time.Millisecond,
		"every event either ran or was dead-lettered (the first did both)")
	seen := map[string]bool{}
	for len(dls) > 0 {
		dl := <-dls
		require.NotEmpty(t, dl.Envelope.ID, "a dead letter lost its envelope")
		require.False(t, seen[dl.Envelope.ID], "dead-lettered twice: %s", dl.Envelope.ID)
		seen[dl.Envelope.ID] = true
		require.Equal(t, dl.Envelope.ID, fmt.Sprint("e", dl.Envelope.Event.(tick).N))
	}
	require.True(t, seen["e0"])
}
