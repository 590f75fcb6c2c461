package dbtest

import (
	"context"
	"testing"
	"time"
)

// The private instance answers, survives Restart, Kill+Start, Pause+Resume,
// and is gone after the test.
func TestServerLifecycle(t *testing.T) {
	s := NewServer(t)
	db := s.Open(t)
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := db.ExecContext(ctx, "SELECT 1")
		return err
	}
	eventually := func(what string) {
		t.Helper()
		var err error
		for range 50 {
			if err = ping(); err == nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("%s: %v", what, err)
	}
	eventually("started")
	s.Restart()
	eventually("restarted")
	s.Kill()
	if err := ping(); err == nil {
		t.Fatal("killed server answered")
	}
	s.Start()
	eventually("started after kill")
	s.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err := db.ExecContext(ctx, "SELECT 1")
	cancel()
	if err == nil {
		t.Fatal("paused server answered")
	}
	s.Resume()
	eventually("resumed")
}
