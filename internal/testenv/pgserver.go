package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PGServer is a private PostgreSQL instance a test may stop and restart
// without touching the shared one.
type PGServer struct {
	dir, bin string
	Port     int
	URL      string
}

// StartPostgres initialises a data directory in a temporary folder and
// starts PostgreSQL on a free loopback port. As root it runs the server as
// the postgres user. It is stopped and removed when the test ends.
func StartPostgres(t testing.TB) *PGServer {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		t.Fatal("no initdb under /usr/lib/postgresql/*/bin: install the PostgreSQL server package")
	}
	s := &PGServer{bin: filepath.Dir(bins[len(bins)-1])}
	dir, err := os.MkdirTemp("", "projector-pg-")
	if err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs a postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s.run(t, "initdb", "-D", s.data(), "-U", "postgres", "-A", "trust", "--no-sync")
	s.ctl(t, "start")
	t.Cleanup(func() { _ = s.pgctl("stop", "-m", "immediate") })
	s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.Port)
	pool, err := pgxpool.New(context.Background(), s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatalf("private postgres did not answer: %v", err)
	}
	return s
}

func (s *PGServer) data() string { return filepath.Join(s.dir, "data") }

// DB returns a pool on the server's database, closed when the test ends.
// A test whose outcome depends on what every transaction of the cluster
// holds back (such as how far Postgres prunes dead rows) runs on a
// server of its own: the shared one serves other packages' tests at the
// same time.
func (s *PGServer) DB(t testing.TB) *DB {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), s.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &DB{Pool: pool, URL: s.URL, Schema: "public"}
}

// Restart stops the server with a fast shutdown (open connections are
// terminated, open transactions roll back) and starts it again.
func (s *PGServer) Restart(t testing.TB) {
	t.Helper()
	s.ctl(t, "restart", "-m", "fast")
}

// Stop stops the server with a fast shutdown; Start starts it again.
func (s *PGServer) Stop(t testing.TB) {
	t.Helper()
	s.ctl(t, "stop", "-m", "fast")
}

// Start starts a server that Stop stopped.
func (s *PGServer) Start(t testing.TB) {
	t.Helper()
	s.ctl(t, "start")
}

func (s *PGServer) ctl(t testing.TB, action string, args ...string) {
	t.Helper()
	if err := s.pgctl(action, args...); err != nil {
		t.Fatal(err)
	}
}

func (s *PGServer) pgctl(action string, args ...string) error {
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", s.Port, s.dir)
	full := append([]string{action, "-D", s.data(), "-w", "-l", filepath.Join(s.dir, "log"), "-o", opts}, args...)
	out, err := s.command("pg_ctl", full...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %v\n%s", action, err, out)
	}
	return nil
}

func (s *PGServer) run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := s.command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

func (s *PGServer) command(name string, args ...string) *exec.Cmd {
	bin := filepath.Join(s.bin, name)
	if os.Geteuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", bin}, args...)...)
	}
	return exec.Command(bin, args...)
}
