package dbtest

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// fakeServer is a Server whose socket is a plain Unix listener (no
// PostgreSQL): each connection is handed to serve. The listener and the
// connections are closed when t ends.
func fakeServer(t *testing.T, serve func(net.Conn)) *Server {
	t.Helper()
	dir, err := os.MkdirTemp("", "keysched-fakepg-")
	if err != nil {
		t.Fatal(err)
	}
	const port = 5999
	ln, err := net.Listen("unix", filepath.Join(dir, fmt.Sprintf(".s.PGSQL.%d", port)))
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		os.RemoveAll(dir)
	})
	return &Server{t: t, dir: dir, sock: dir, port: port}
}

// recordingTB is a testing.TB whose Cleanup functions are kept for the test
// to run itself.
type recordingTB struct {
	testing.TB
	cleanups []func()
}

func (r *recordingTB) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

func (r *recordingTB) runCleanups() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// A proxy holding a client's bytes for a long delay (a stalled database, as
// a test of timeouts makes one with SetDelay(time.Hour)) stops at once when
// its test ends: the bytes held are dropped, not waited for.
func TestLatencyProxyStopsWithBytesHeld(t *testing.T) {
	accepted := make(chan struct{}, 1)
	srv := fakeServer(t, func(c net.Conn) {
		accepted <- struct{}{}
		_, _ = c.Read(make([]byte, 1))
	})
	rec := &recordingTB{TB: t}
	p := srv.LatencyProxy(rec, time.Hour)
	c, err := net.Dial("unix", filepath.Join(p.dir, fmt.Sprintf(".s.PGSQL.%d", srv.port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	<-accepted
	if _, err := c.Write([]byte("held for an hour")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the proxy reads them and holds them
	stopped := make(chan struct{})
	go func() {
		rec.runCleanups()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the proxy's cleanup still waits, 5 s on, for bytes it holds for an hour")
	}
}

// A client that sends its request and then closes its side for writing
// (shutdown(SHUT_WR)) still gets the server's answer through the proxy:
// the client's end of stream is passed on to the server after the bytes
// before it, and the answer comes back before the proxy closes the
// connection.
func TestLatencyProxyPassesTheAnswerToAHalfClosedClient(t *testing.T) {
	srv := fakeServer(t, func(c net.Conn) {
		b, err := io.ReadAll(c) // the request, up to the client's end of stream
		if err != nil {
			return
		}
		_, _ = c.Write(append([]byte("answer to "), b...))
	})
	p := srv.LatencyProxy(t, 10*time.Millisecond)
	c, err := net.Dial("unix", filepath.Join(p.dir, fmt.Sprintf(".s.PGSQL.%d", srv.port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.UnixConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if string(got) != "answer to request" {
		t.Fatalf("the half-closed client read %q (%v), want %q", got, err, "answer to request")
	}
}

// A connection accepted as the proxy stops is closed with the others: the
// stop does not wait for its client to hang up. (Each round connects and
// stops the proxy at once, a few µs apart; before, about 1 round in 6 left
// a connection open and the stop waiting on it.)
func TestLatencyProxyStopsWhileAClientConnects(t *testing.T) {
	srv := fakeServer(t, func(c net.Conn) { _, _ = c.Read(make([]byte, 1)) })
	for round := range 100 {
		rec := &recordingTB{TB: t}
		p := srv.LatencyProxy(rec, 0)
		c, err := net.Dial("unix", filepath.Join(p.dir, fmt.Sprintf(".s.PGSQL.%d", srv.port)))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(round%20) * time.Microsecond)
		stopped := make(chan struct{})
		go func() {
			rec.runCleanups()
			close(stopped)
		}()
		select {
		case <-stopped:
			c.Close()
		case <-time.After(5 * time.Second):
			c.Close() // lets the stop end
			<-stopped
			t.Fatalf("round %d: the proxy's stop still waited, 5 s on, for a client connected as it stopped", round)
		}
	}
}
