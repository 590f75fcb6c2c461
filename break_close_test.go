package keysched

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Close gives up while keys park, a dead-letter function resumes or skips
// the key it reports, another goroutine resumes and skips too, retries wait
// out backoffs and submitters keep submitting batches: every Completion is
// done exactly once, after its dead letters, and Stats settles.
func TestBreakCloseRacesParkResume(t *testing.T) {
	for iter := range 12 {
		t.Run(fmt.Sprint(iter), func(t *testing.T) {
			const keys = 4
			var s *Scheduler[int]
			var letters atomic.Int64
			var dlAfterDone atomic.Int64
			rng := rand.New(rand.NewPCG(uint64(iter), 3))
			slow := iter%3 == 0
			var err error
			s, err = New[int](WithLogger(quiet), WithWorkers(2), WithMaxKeyDepth(4), WithMaxPending(12),
				WithFailurePolicy(Park),
				WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Duration(1+iter%4) * 100 * time.Microsecond}),
				WithDeadLetter(func(dl DeadLetter[int]) {
					letters.Add(1)
					if c, ok := dl.Context.(dlContext); ok && c.c.state.Load() == stDone {
						dlAfterDone.Add(1)
					}
					if slow {
						time.Sleep(200 * time.Microsecond) // a slow sink
					}
					switch dl.Key % 3 {
					case 0:
						_ = s.Resume(dl.Key)
					case 1:
						_ = s.Skip(dl.Key)
					}
				}))
			require.NoError(t, err)
			var mu sync.Mutex
			var all []*Completion
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for sub := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(iter), uint64(sub)))
					for {
						select {
						case <-stop:
							return
						default:
						}
						items := make([]BatchItem[int], 1+r.IntN(4))
						for i := range items {
							fail := r.IntN(3) == 0
							items[i] = BatchItem[int]{Key: r.IntN(keys), Task: func(context.Context) error {
								if fail {
									return errFlaky
								}
								return nil
							}}
						}
						ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
						cs, err := s.SubmitBatch(ctx, items)
						cancel()
						mu.Lock()
						all = append(all, cs...)
						mu.Unlock()
						if errors.Is(err, ErrClosed) {
							return
						}
					}
				}()
			}
			wg.Add(1)
			go func() { // a resolver racing Close
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					for _, k := range s.Parked() {
						if rng.IntN(2) == 0 {
							_ = s.Resume(k)
						} else {
							_ = s.Skip(k)
						}
					}
					time.Sleep(100 * time.Microsecond) // polling pace
				}
			}()
			time.Sleep(time.Duration(2+iter%5) * time.Millisecond) // let work pile up (not synchronisation)
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			cerr := s.Close(ctx)
			cancel()
			close(stop)
			wg.Wait()
			requireCloseSettles(t, s, cerr, all)
			require.Zero(t, dlAfterDone.Load(), "a dead letter delivered after its Completion was done")
			st := s.Stats()
			assertAccounting(t, st)
			require.Zero(t, st.Keys, "%+v", st)
			require.Zero(t, st.ParkedKeys, "%+v", st)
			require.Equal(t, uint64(len(all)), st.Submitted)
			// Dead letters still in delivery when the last Completion was done
			// (none should be) would show here.
			require.Equal(t, uint64(letters.Load()), st.DeadLettered)
		})
	}
}
