package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
)

// terminator ends every other client session of a server every 5ms, as
// a restart or a failover does, until stopped.
type terminator struct {
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	n    int64 // sessions ended
}

func terminate(t *testing.T, url string) *terminator {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	k := &terminator{stop: make(chan struct{})}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		defer conn.Close(t.Context())
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			var n int64
			if err := conn.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'`).Scan(&n); err == nil {
				k.mu.Lock()
				k.n += n
				k.mu.Unlock()
			}
			select {
			case <-k.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(k.halt)
	return k
}

// halt stops the terminations and waits for them to end.
func (k *terminator) halt() {
	select {
	case <-k.stop:
	default:
		close(k.stop)
	}
	k.wg.Wait()
}

func (k *terminator) ended() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.n
}

const startupRetry = "PostgreSQL not ready at startup; retrying"

// TestStartupRidesOutDroppedConnections: a replica that starts while
// PostgreSQL is down, and then ends its sessions every 5ms (a restart, a
// failover), retries connecting and migrating with backoff instead of
// exiting, and once the server settles it projects the whole stream: the
// table equals the reference fold. migrate does the same. The server is
// down when the command starts, so that its retries do not depend on how
// soon the terminations begin.
func TestStartupRidesOutDroppedConnections(t *testing.T) {
	srv := testenv.StartPostgres(t)
	e := newRunEnv(t, 3, 500)
	e.onServer(t, srv)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"migrate", []string{"migrate", "--database-url", srv.URL, "--config", e.config}},
		{"run", e.args("restarts")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv.Stop(t)
			r := start(t, tc.args...)
			retries := func(want int) func() error {
				return func() error {
					r.running(t)
					if n := strings.Count(r.out.String(), startupRetry); n < want {
						return fmt.Errorf("%d of %d startup retries logged", n, want)
					}
					return nil
				}
			}
			testenv.WaitFor(t, time.Minute, retries(3))
			srv.Start(t)
			k := terminate(t, srv.URL)
			// Sessions ended while it connects or migrates are retried;
			// a migrate that finished first has nothing left to end.
			testenv.WaitFor(t, time.Minute, func() error {
				if k.ended() == 0 && !r.hasExited() {
					return errors.New("no session ended yet")
				}
				return nil
			})
			k.halt()
			if tc.name == "migrate" {
				if err := r.exited(t, time.Minute); err != nil {
					t.Fatalf("migrate failed once PostgreSQL settled: %v\n%s", err, r.out)
				}
				if !strings.Contains(r.out.String(), "migrated:") {
					t.Fatalf("migrate did not say it migrated:\n%s", r.out)
				}
				return
			}
			e.verify(t, "restarts", time.Minute, r.out)
		})
	}
}

// TestStartupTimeout: startup gives up after --startup-timeout with a
// message that names the flag and what to do, not at the first failure.
func TestStartupTimeout(t *testing.T) {
	config := filepath.Join(t.TempDir(), "projections.yaml")
	if err := os.WriteFile(config, demo.Projections, 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	began := time.Now()
	err := Main(t.Context(), []string{"migrate", "--config", config, "--startup-timeout", "1500ms",
		"--database-url", "postgres://postgres@127.0.0.1:1/test?sslmode=disable"}, &out, &out)
	took := time.Since(began)
	if err == nil {
		t.Fatal("migrate against a closed port succeeded")
	}
	for _, want := range []string{"--startup-timeout 1.5s", "127.0.0.1:1", "Start PostgreSQL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
	if took < time.Second || took > 10*time.Second {
		t.Errorf("gave up after %v, want about 1.5s", took)
	}
	if n := strings.Count(out.String(), startupRetry); n < 2 {
		t.Errorf("%d retries logged, want several:\n%s", n, &out)
	}
}

// TestHealthWhileStarting: while startup waits for PostgreSQL, /livez
// answers (an orchestrator must not kill the process for waiting) and
// /readyz fails, saying what startup waits for.
func TestHealthWhileStarting(t *testing.T) {
	e := newRunEnv(t, 1, 0)
	args := e.args("waiting", "--http-addr", "127.0.0.1:0",
		"--database-url", "postgres://postgres@127.0.0.1:1/test?sslmode=disable")
	r := start(t, args...)
	addr := regexp.MustCompile(`"msg":"serving metrics and health","addr":"([^"]+)"`)
	var base string
	testenv.WaitFor(t, 30*time.Second, func() error {
		r.running(t)
		m := addr.FindStringSubmatch(r.out.String())
		if m == nil {
			return errors.New("no HTTP address logged yet")
		}
		base = "http://" + m[1]
		return nil
	})
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	if code, body := get("/livez"); code != http.StatusOK {
		t.Errorf("/livez while starting: %d %s, want 200", code, body)
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		code, body := get("/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "startup") || !strings.Contains(body, "connect failed, retrying") {
			return fmt.Errorf("/readyz while starting: %d %q, want 503 saying that connecting is retried", code, body)
		}
		return nil
	})
	if _, body := get("/metrics"); !regexp.MustCompile(`projector_startup_retries_total\{step="connect"\} [1-9]`).MatchString(body) {
		t.Errorf("/metrics does not count the retries of connecting:\n%s", body)
	}
}
