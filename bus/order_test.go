package bus

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// The events of the property test. Each carries who published it and its
// sequence number in that publisher's stream.
type stamped interface{ stamp() (pub, seq int) }

type evA struct{ Pub, Seq int }
type evB struct{ Pub, Seq int }
type evC struct{ Pub, Seq int } // matches no interface below

func (e evA) stamp() (int, int)  { return e.Pub, e.Seq }
func (e *evB) stamp() (int, int) { return e.Pub, e.Seq }
func (e evC) stamp() (int, int)  { return e.Pub, e.Seq }

type labelled interface{ label() string }

func (evA) label() string  { return "a" }
func (*evB) label() string { return "b" }

// delivery is one handler run seen by the property test.
type delivery struct{ pub, seq int }

// recorder records, per key, what one subscriber's handler saw, and whether
// two of its handlers ever overlapped on one key.
type recorder struct {
	mu       sync.Mutex
	byKey    map[int][]delivery
	inFlight sync.Map // key -> *atomic.Int32
	overlaps atomic.Int32
}

func newRecorder() *recorder { return &recorder{byKey: map[int][]delivery{}} }

func (r *recorder) handle(key int, ev any) {
	c, _ := r.inFlight.LoadOrStore(key, new(atomic.Int32))
	n := c.(*atomic.Int32)
	if n.Add(1) != 1 {
		r.overlaps.Add(1)
	}
	runtime.Gosched() // give an overlapping run a chance to show
	pub, seq := ev.(stamped).stamp()
	r.mu.Lock()
	r.byKey[key] = append(r.byKey[key], delivery{pub, seq})
	r.mu.Unlock()
	n.Add(-1)
}

// Property 1: typed routing, interface routing, and per-(key, subscriber)
// order under concurrent publishers. Each publisher publishes its own
// stream in order; every subscriber must get exactly the events whose type
// it matches, each once, each publisher's events of a key in that
// publisher's order, and never two of its handlers at once on one key.
func TestRoutingAndOrderProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		workers := rapid.IntRange(1, 4).Draw(rt, "workers")
		depth := rapid.IntRange(1, 6).Draw(rt, "maxKeyDepth")
		withAny := rapid.Bool().Draw(rt, "anySubscriber")
		nPub := rapid.IntRange(1, 4).Draw(rt, "publishers")
		nKeys := rapid.IntRange(1, 5).Draw(rt, "keys")
		type step struct{ key, kind int }
		streams := make([][]step, nPub)
		for p := range streams {
			streams[p] = rapid.SliceOfN(rapid.Custom(func(t *rapid.T) step {
				return step{rapid.IntRange(0, nKeys-1).Draw(t, "key"), rapid.IntRange(0, 2).Draw(t, "kind")}
			}), 0, 40).Draw(rt, fmt.Sprint("stream", p))
		}

		ctx := guardCtx(t)
		b, err := New[int](WithWorkers(workers), WithLogger(quiet))
		require.NoError(rt, err)
		recs := map[string]*recorder{"A": newRecorder(), "*B": newRecorder(), "labelled": newRecorder(), "any": newRecorder()}
		_, err = Subscribe(b, "A", func(_ context.Context, env Envelope[int], ev evA) error {
			recs["A"].handle(env.Key, ev)
			return nil
		}, MaxKeyDepth(depth))
		require.NoError(rt, err)
		_, err = Subscribe(b, "*B", func(_ context.Context, env Envelope[int], ev *evB) error {
			recs["*B"].handle(env.Key, ev)
			return nil
		}, MaxKeyDepth(depth), MaxConcurrency(1))
		require.NoError(rt, err)
		_, err = Subscribe(b, "labelled", func(_ context.Context, env Envelope[int], ev labelled) error {
			recs["labelled"].handle(env.Key, ev)
			return nil
		}, MaxKeyDepth(depth))
		require.NoError(rt, err)
		if withAny {
			_, err = Subscribe(b, "any", func(_ context.Context, env Envelope[int], ev any) error {
				recs["any"].handle(env.Key, ev)
				return nil
			})
			require.NoError(rt, err)
		}

		// matches says which subscribers an event of a kind goes to.
		matches := func(kind int) []string {
			var m []string
			switch kind {
			case 0:
				m = []string{"A", "labelled"}
			case 1:
				m = []string{"*B", "labelled"}
			}
			if withAny {
				m = append(m, "any")
			}
			return m
		}

		var wg sync.WaitGroup
		errs := make(chan error, nPub)
		for p, stream := range streams {
			wg.Go(func() {
				for seq, st := range stream {
					var ev any
					switch st.kind {
					case 0:
						ev = evA{p, seq}
					case 1:
						ev = &evB{p, seq}
					default:
						ev = evC{p, seq}
					}
					if err := b.Publish(ctx, st.key, ev); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			rt.Fatalf("Publish: %v", err)
		}
		require.NoError(rt, b.Drain(ctx))
		require.NoError(rt, b.Close(ctx))

		// The model: per subscriber and key, each publisher's events in order.
		want := map[string]map[int][]delivery{}
		unmatched := 0
		for p, stream := range streams {
			for seq, st := range stream {
				subs := matches(st.kind)
				if len(subs) == 0 {
					unmatched++
				}
				for _, name := range subs {
					if want[name] == nil {
						want[name] = map[int][]delivery{}
					}
					want[name][st.key] = append(want[name][st.key], delivery{p, seq})
				}
			}
		}
		for name, rec := range recs {
			require.Zero(rt, rec.overlaps.Load(), "%s ran two handlers of one key at once", name)
			for key := range nKeys {
				got := rec.byKey[key]
				// Each publisher's subsequence, in order, equals the model's.
				for p := range nPub {
					require.Equal(rt, onlyPub(want[name][key], p), onlyPub(got, p),
						"subscriber %s, key %d, publisher %d", name, key, p)
				}
				require.Len(rt, got, len(want[name][key]), "subscriber %s, key %d: exactly once", name, key)
			}
		}
		require.EqualValues(rt, unmatched, b.Stats().Unmatched)
	})
}

func onlyPub(ds []delivery, p int) []delivery {
	var out []delivery
	for _, d := range ds {
		if d.pub == p {
			out = append(out, d)
		}
	}
	return out
}
