package keysched

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A parked task that Close gives up on had run and failed: its outcome
// matches ErrAborted but does not say "before it ran"; it gets two dead
// letters (the Park's, with the task's error, and the abort's), and Stats
// counts both deliveries.
func TestParkedTaskAbortedByCloseSaysItRan(t *testing.T) {
	boom := errors.New("boom")
	var mu sync.Mutex
	var letters []error
	s, err := New[string](WithLogger(quiet), WithFailurePolicy(Park),
		WithDeadLetter(func(dl DeadLetter[string]) {
			mu.Lock()
			letters = append(letters, dl.Err)
			mu.Unlock()
		}))
	require.NoError(t, err)
	parked, err := s.Submit(context.Background(), "k", func(context.Context) error { return boom })
	require.NoError(t, err)
	queued, err := s.Submit(context.Background(), "k", func(context.Context) error { return nil })
	require.NoError(t, err)
	for len(s.Parked()) == 0 {
		time.Sleep(time.Millisecond)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, s.Close(ended), ErrAborted)
	<-parked.Done()
	<-queued.Done()

	require.ErrorIs(t, parked.Err(), ErrAborted)
	require.NotContains(t, parked.Err().Error(), "before it ran", "the parked task ran")
	require.Contains(t, parked.Err().Error(), "parked task aborted by Close")
	require.Equal(t, ErrAborted, queued.Err(), "a task that never ran has the sentinel itself") //nolint:testifylint // identity, not errors.Is

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, letters, 3, "Park's letter, the parked task's abort, the queued task's abort")
	require.ErrorIs(t, letters[0], boom)
	require.True(t, strings.Contains(letters[1].Error(), "parked task aborted"), letters[1].Error())
	require.Equal(t, ErrAborted, letters[2]) //nolint:testifylint // identity
	st := s.Stats()
	require.EqualValues(t, 3, st.DeadLettered)
	require.EqualValues(t, 2, st.Aborted)
}

// Park, then Resume and success: the task counts in Succeeded, and its
// Park's dead letter in DeadLettered (deliveries, not outcomes).
func TestParkResumeSuccessCountsTheParkLetter(t *testing.T) {
	var failed sync.Once
	s, err := New[string](WithLogger(quiet), WithFailurePolicy(Park),
		WithDeadLetter(func(dl DeadLetter[string]) {}))
	require.NoError(t, err)
	c, err := s.Submit(context.Background(), "k", func(context.Context) error {
		err := errors.New("first run fails")
		ran := false
		failed.Do(func() { ran = true })
		if ran {
			return err
		}
		return nil
	})
	require.NoError(t, err)
	for len(s.Parked()) == 0 {
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, s.Resume("k"))
	<-c.Done()
	require.NoError(t, c.Err())
	require.NoError(t, s.Close(context.Background()))
	st := s.Stats()
	require.EqualValues(t, 1, st.Succeeded)
	require.EqualValues(t, 0, st.Failed)
	require.EqualValues(t, 1, st.DeadLettered)
}

// A task waiting out a retry backoff when Close gives up had run too: its
// outcome matches ErrAborted and says it ran.
func TestRetryingTaskAbortedByCloseSaysItRan(t *testing.T) {
	s, err := New[string](WithLogger(quiet),
		WithRetry(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Hour, MaxBackoff: time.Hour}))
	require.NoError(t, err)
	c, err := s.Submit(context.Background(), "k", func(context.Context) error { return errors.New("flaky") })
	require.NoError(t, err)
	for s.Stats().Retried == 0 {
		time.Sleep(time.Millisecond)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, s.Close(ended), ErrAborted)
	<-c.Done()
	require.ErrorIs(t, c.Err(), ErrAborted)
	require.Contains(t, c.Err().Error(), "before it ran again")
}
