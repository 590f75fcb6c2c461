package dbtest

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keysched/keysched/db/sqldb"
)

// A LatencyProxy stands between clients and a Server: a Unix socket of its
// own that forwards every connection to the server's, holding each chunk of
// bytes a client sends for the delay before passing it on (the server's
// answers pass at once). Every round trip to the server takes the delay
// longer, as with a database in another zone or region; the bytes keep
// their order and nothing is lost (a client's end of stream is passed on
// after its bytes, and the server's answer still comes back). SetDelay
// changes it at any time, for the bytes read from then on.
type LatencyProxy struct {
	srv   *Server
	dir   string
	ln    net.Listener
	delay atomic.Int64  // ns
	stop  chan struct{} // closed when the proxy stops: bytes held are dropped

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

// LatencyProxy starts a proxy to s with the given delay, stopped when t
// ends: every connection through it closed (one accepted meanwhile too), the
// bytes it still holds dropped, not waited for.
func (s *Server) LatencyProxy(t testing.TB, delay time.Duration) *LatencyProxy {
	t.Helper()
	dir, err := os.MkdirTemp("", "keysched-pgproxy-")
	if err != nil {
		t.Fatal(err)
	}
	// The socket's name is the one libpq and pgx derive from the port.
	ln, err := net.Listen("unix", filepath.Join(dir, fmt.Sprintf(".s.PGSQL.%d", s.port)))
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	p := &LatencyProxy{srv: s, dir: dir, ln: ln, stop: make(chan struct{})}
	p.delay.Store(int64(delay))
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		close(p.stop) // the bytes held are not waited for
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
		os.RemoveAll(dir)
	})
	return p
}

// SetDelay sets the delay of the bytes clients send from now on. They keep
// their order: after a shorter delay, a connection's new bytes still follow
// the bytes it holds from before.
func (p *LatencyProxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// DSN returns the server's DSN with the proxy's socket in place of the
// server's.
func (p *LatencyProxy) DSN() string {
	return strings.Replace(p.srv.DSN(), "host="+p.srv.sock, "host="+p.dir, 1)
}

// Open opens a *sql.DB through the proxy (the DSN plus extra key=value
// settings), closed when t ends.
func (p *LatencyProxy) Open(t testing.TB, extra ...string) *sql.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sqldb.OpenPostgres(ctx, strings.Join(append([]string{p.DSN()}, extra...), " "))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func (p *LatencyProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		s, err := net.Dial("unix", filepath.Join(p.srv.sock, fmt.Sprintf(".s.PGSQL.%d", p.srv.port)))
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		select {
		case <-p.stop: // accepted as the proxy stops: the stop has closed the others
			p.mu.Unlock()
			s.Close()
			c.Close()
			return
		default:
		}
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			if p.delayed(s, c) {
				// The client's end of stream, after its bytes: the
				// server answers them and ends the connection (the
				// copy below then closes both sides).
				if err := s.(*net.UnixConn).CloseWrite(); err == nil {
					return
				}
			}
			s.Close()
			c.Close()
		}()
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(c, s)
			s.Close()
			c.Close()
		}()
	}
}

// chunk is bytes read from a client, due to the server at a time.
type chunk struct {
	due  time.Time
	data []byte
}

// delayed copies src to dst, each chunk p's delay after it was read (or
// never, once the proxy stops). It reports whether it copied all of src, up
// to its end (io.EOF).
func (p *LatencyProxy) delayed(dst io.Writer, src io.Reader) (all bool) {
	q := make(chan chunk, 1024)
	done := make(chan struct{})
	written := false // every chunk of q written (read after done)
	go func() {
		defer close(done)
		timer := time.NewTimer(0)
		defer timer.Stop()
		for c := range q {
			timer.Reset(time.Until(c.due))
			var err error
			select {
			case <-timer.C:
				_, err = dst.Write(c.data)
			case <-p.stop:
				err = io.ErrClosedPipe
			}
			if err != nil {
				for range q { // drain: the reader ends when the client's side closes
				}
				return
			}
		}
		written = true
	}()
	var rerr error
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{due: time.Now().Add(time.Duration(p.delay.Load())), data: buf[:n]}
		}
		if err != nil {
			rerr = err
			break
		}
	}
	close(q)
	<-done
	return written && rerr == io.EOF
}
