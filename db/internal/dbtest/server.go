package dbtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keysched/keysched/db/sqldb"
)

// PGBinDir holds initdb, pg_ctl and postgres of Debian's PostgreSQL 15; the
// variable KEYSCHED_TEST_PGBIN overrides it.
const PGBinDir = "/usr/lib/postgresql/15/bin"

// EnvPGBin names the variable that overrides PGBinDir.
const EnvPGBin = "KEYSCHED_TEST_PGBIN"

// A Server is a private PostgreSQL instance that one test owns: its own data
// directory and Unix socket directory in a fresh temporary directory, no TCP
// listener, trust authentication for the superuser postgres. Fault tests stop,
// restart, kill and pause it without disturbing the shared server of the
// other tests. When the test process runs as root, the server's programs run
// as the OS user postgres (runuser), which owns the directory.
//
// Its methods fail the test (t.Fatal) when a pg_ctl command fails, so call
// them from the test's goroutine. NewServer registers a cleanup that kills
// the instance (resuming it first if paused) and removes its directory.
type Server struct {
	t    testing.TB
	bin  string
	dir  string // temporary root: data/, sock/, log
	data string
	sock string
	port int
	log  string
	user string // run as this OS user ("" = the current one)
}

// NewServer starts a private PostgreSQL instance for t and returns it
// running: a copy of a data directory made once by initdb (see template),
// started with fsync off. Without the binaries it fails t, saying what is
// missing, unless KEYSCHED_SKIP_POSTGRES=1 (then it skips), as Postgres does
// for the shared server.
func NewServer(t testing.TB) *Server {
	t.Helper()
	bin := PGBinDir
	if b := os.Getenv(EnvPGBin); b != "" {
		bin = b
	}
	if _, err := os.Stat(filepath.Join(bin, "pg_ctl")); err != nil {
		msg := fmt.Sprintf("\n*** POSTGRESQL BINARIES NOT AVAILABLE: %v\n*** (set %s to the directory of initdb and pg_ctl). These PostgreSQL fault tests did NOT run.\n", err, EnvPGBin)
		if os.Getenv(EnvSkip) == "1" {
			t.Skip(msg)
		}
		t.Fatal(msg + SetupHint)
	}
	s := &Server{t: t, bin: bin, port: 5432}
	dir, err := os.MkdirTemp("", "keysched-pg-")
	if err != nil {
		t.Fatal(err)
	}
	s.dir, s.data, s.sock, s.log = dir, filepath.Join(dir, "data"), filepath.Join(dir, "sock"), filepath.Join(dir, "log")
	if err := os.Mkdir(s.sock, 0o700); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root.
		s.user = "postgres"
		if err := s.chown(dir, s.sock); err != nil {
			os.RemoveAll(dir)
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		s.signalAll(syscall.SIGCONT)
		_, _ = s.pgCtl("-m", "immediate", "stop") // best effort: it may be stopped or killed
		s.signalAll(syscall.SIGKILL)
		os.RemoveAll(dir)
	})
	tmpl, err := s.template()
	if err != nil {
		t.Fatal(err)
	}
	// cp -a keeps the owner (postgres) and the modes PostgreSQL checks.
	if out, err := exec.Command("cp", "-a", tmpl, s.data).CombinedOutput(); err != nil {
		t.Fatalf("dbtest: copy the initdb template: %v\n%s", err, out)
	}
	s.Start()
	return s
}

// template returns a data directory made by initdb, shared by every Server
// of the machine (of this binary directory and user): initdb takes seconds
// on a loaded machine, a copy a fraction of one. It lives in the temporary
// directory like Go's build cache, made once (in a directory of its own,
// then renamed into place, so concurrent test processes never see half of
// one) and never changed: each Server copies it.
func (s *Server) template() (string, error) {
	final := filepath.Join(os.TempDir(), fmt.Sprintf("keysched-pg-template-%d-%x", os.Geteuid(), fnv32(s.bin)))
	if _, err := os.Stat(filepath.Join(final, "PG_VERSION")); err == nil {
		return final, nil
	}
	work, err := os.MkdirTemp("", "keysched-pg-initdb-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	if s.user != "" {
		if err := s.chown(work); err != nil {
			return "", err
		}
	}
	data := filepath.Join(work, "data")
	if out, err := s.run(filepath.Join(s.bin, "initdb"), "-D", data, "-N", "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"); err != nil {
		return "", fmt.Errorf("dbtest: initdb: %w\n%s", err, out)
	}
	if err := os.Rename(data, final); err != nil {
		if _, e := os.Stat(filepath.Join(final, "PG_VERSION")); e == nil {
			return final, nil // another process made it first
		}
		return "", fmt.Errorf("dbtest: initdb template: %w", err)
	}
	return final, nil
}

func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

func (s *Server) chown(paths ...string) error {
	u, err := user.Lookup(s.user)
	if err != nil {
		return fmt.Errorf("dbtest: running as root and no OS user %s to run the server as: %w", s.user, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	for _, p := range paths {
		if err := os.Chown(p, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

// DSN returns the instance's DSN (key=value form, for pgx): its socket
// directory and port, user postgres, database postgres.
func (s *Server) DSN() string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", s.sock, s.port)
}

// Open opens a *sql.DB on the instance (the DSN plus extra key=value
// settings, such as "options='-c statement_timeout=100'"), closed when t ends.
func (s *Server) Open(t testing.TB, extra ...string) *sql.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := sqldb.OpenPostgres(ctx, strings.Join(append([]string{s.DSN()}, extra...), " "))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Start starts the stopped or killed instance and waits until it accepts
// connections.
func (s *Server) Start() {
	s.t.Helper()
	opts := fmt.Sprintf("-k %s -p %d -c listen_addresses= -c fsync=off -c max_connections=100", s.sock, s.port)
	if out, err := s.pgCtl("-l", s.log, "-w", "-t", "60", "-o", opts, "start"); err != nil {
		s.t.Fatalf("dbtest: pg_ctl start: %v\n%s\nserver log:\n%s", err, out, s.logTail())
	}
}

// Stop stops the instance with pg_ctl's fast mode: open transactions are
// rolled back, every connection is closed, then the server exits cleanly.
func (s *Server) Stop() {
	s.t.Helper()
	if out, err := s.pgCtl("-m", "fast", "-w", "-t", "60", "stop"); err != nil {
		s.t.Fatalf("dbtest: pg_ctl stop: %v\n%s", err, out)
	}
}

// Restart stops the instance (fast) and starts it again.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}

// Kill kills every process of the instance with SIGKILL (a crashed
// server: no shutdown, its connections cut); Start recovers it.
func (s *Server) Kill() {
	s.t.Helper()
	s.signalAll(syscall.SIGKILL)
	// Wait for the postmaster to be gone, then remove its pid file so that
	// pg_ctl start does not wait on a dead pid.
	deadline := time.Now().Add(10 * time.Second)
	for pid := s.postmaster(); pid > 0 && syscall.Kill(pid, 0) == nil; {
		if time.Now().After(deadline) {
			s.t.Fatalf("dbtest: postmaster %d survives SIGKILL", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	os.Remove(filepath.Join(s.data, "postmaster.pid"))
}

// Pause stops every process of the instance with SIGSTOP: a hung server (a
// network partition, a stalled failover). New connections wait in the
// socket's backlog and queries on open ones wait; nothing fails by itself.
// Resume continues it.
func (s *Server) Pause() { s.signalAll(syscall.SIGSTOP) }

// Resume continues a paused instance (SIGCONT).
func (s *Server) Resume() { s.signalAll(syscall.SIGCONT) }

// postmaster returns the pid in postmaster.pid, or 0.
func (s *Server) postmaster() int {
	b, err := os.ReadFile(filepath.Join(s.data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(line)))
	return pid
}

// signalAll sends sig to the postmaster and to its children (the backends
// and auxiliary processes), found in /proc.
func (s *Server) signalAll(sig syscall.Signal) {
	pm := s.postmaster()
	if pm <= 0 {
		return
	}
	pids := []int{pm}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut at the
		// last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 {
			if ppid, _ := strconv.Atoi(f[1]); ppid == pm {
				pids = append(pids, pid)
			}
		}
	}
	if sig == syscall.SIGSTOP {
		// Children first, so that none is reaped and replaced meanwhile.
		for i := len(pids) - 1; i >= 0; i-- {
			_ = syscall.Kill(pids[i], sig) // a process gone meanwhile is fine
		}
		return
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, sig) // a process gone meanwhile is fine
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func (s *Server) pgCtl(args ...string) ([]byte, error) {
	return s.run(filepath.Join(s.bin, "pg_ctl"), append([]string{"-D", s.data}, args...)...)
}

// run runs a server program, as s.user when set.
func (s *Server) run(prog string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var cmd *exec.Cmd
	if s.user != "" {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", s.user, "--", prog}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, prog, args...)
	}
	cmd.Dir = s.dir
	// pg_ctl start leaves the postmaster running with these as its output:
	// a pipe would keep CombinedOutput waiting, so the log goes to -l.
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("%s timed out: %w", prog, err)
	}
	return out.Bytes(), err
}
