package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
)

// syncBuffer is a log sink a running command writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runEnv is what `projector run` needs: a broker with the demo topic, a
// registry with its schemas, a projection file and a fresh schema.
type runEnv struct {
	db      *testenv.DB // where run writes: a fresh schema, or a private server
	cluster *kfake.Cluster
	reg     *srfake.Registry
	config  string
	records []demo.Record
	end     map[int32]int64
	prod    *kgo.Client
	enc     *demo.Encoder
}

// newRunEnv sets up the demo stream of aggregates accounts over
// partitions partitions, produced unless aggregates is 0.
func newRunEnv(t *testing.T, partitions, aggregates int) *runEnv {
	t.Helper()
	ctx := t.Context()
	e := &runEnv{db: testenv.NewDB(t), cluster: testenv.Kafka(t, demo.Topic, partitions)}
	reg, cl := testenv.Registry(t)
	e.reg = reg
	enc, err := demo.RegisterSchemas(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	e.enc = enc
	e.config = filepath.Join(t.TempDir(), "projections.yaml")
	if err := os.WriteFile(e.config, demo.Projections, 0o600); err != nil {
		t.Fatal(err)
	}
	e.prod, err = kgo.NewClient(kgo.SeedBrokers(e.cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.prod.Close)
	if aggregates > 0 {
		opts := demo.DefaultOptions()
		opts.Aggregates, opts.Seed = aggregates, 11
		e.produce(t, demo.Generate(opts))
	}
	return e
}

// onServer makes run write to the public schema of a private server.
func (e *runEnv) onServer(t *testing.T, s *testenv.PGServer) {
	t.Helper()
	e.db = s.DB(t)
}

// produce sends records and notes the topic's new end offsets.
func (e *runEnv) produce(t *testing.T, records []demo.Record) {
	t.Helper()
	if err := demo.Produce(t.Context(), e.prod, e.enc, records, nil); err != nil {
		t.Fatal(err)
	}
	e.records = append(e.records, records...)
	end, err := demo.EndOffsets(t.Context(), kadm.NewClient(e.prod), demo.Topic)
	if err != nil {
		t.Fatal(err)
	}
	e.end = end
}

func (e *runEnv) args(identity string, extra ...string) []string {
	return append([]string{"run",
		"--brokers", e.cluster.ListenAddrs()[0],
		"--registry-url", e.reg.URL(),
		"--database-url", e.db.URL,
		"--identity", identity,
		"--config", e.config,
		"--http-addr", "",
		"--batch-max-records", "200",
		"--log-level", "info",
		"--session-timeout", "6s",
	}, extra...)
}

// tables lists the tables in the test's schema.
func (e *runEnv) tables(t *testing.T) []string {
	t.Helper()
	rows, err := e.db.Pool.Query(t.Context(), `SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1`, e.db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// groups lists the broker's consumer groups.
func (e *runEnv) groups(t *testing.T) []string {
	t.Helper()
	listed, err := kadm.NewClient(e.prod).ListGroups(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return listed.Groups()
}

// verify checks that identity committed the whole stream and that the
// table holds the reference fold of it.
func (e *runEnv) verify(t *testing.T, identity string, timeout time.Duration, logs fmt.Stringer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	if err := demo.WaitCommitted(ctx, e.db.Pool, identity, demo.Topic, e.end, nil); err != nil {
		t.Fatalf("%v\nlogs:\n%s", err, logs)
	}
	if err := demo.Verify(t.Context(), e.db.Pool, demo.Table, demo.Fold(e.records)); err != nil {
		t.Fatal(err)
	}
}

// started runs a command in this process until the test ends (or it
// returns), its output in out.
type started struct {
	out  *syncBuffer
	done chan error
	stop context.CancelFunc
}

func start(t *testing.T, args ...string) *started {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	s := &started{out: &syncBuffer{}, done: make(chan error, 1), stop: cancel}
	go func() { s.done <- Main(ctx, args, s.out, s.out) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			t.Errorf("%s did not stop within 30s of its context", args[0])
		}
	})
	return s
}

// running fails the test if the command has returned.
func (s *started) running(t *testing.T) {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err
		t.Fatalf("exited early: %v\n%s", err, s.out)
	default:
	}
}

// hasExited reports whether the command has returned.
func (s *started) hasExited() bool {
	select {
	case err := <-s.done:
		s.done <- err
		return true
	default:
		return false
	}
}

// exited returns the command's error once it returned; it fails the test
// if the command is still running after timeout.
func (s *started) exited(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		return err
	case <-time.After(timeout):
		t.Fatalf("still running after %v; output:\n%s", timeout, s.out)
		return nil
	}
}

// TestRunChecksBeforeItWrites: a run that cannot start, because its HTTP
// or read API address is taken, a projection has no schema or names a field its
// schema does not have, exits with an error
// naming the cause before it creates a table or joins the group.
func TestRunChecksBeforeItWrites(t *testing.T) {
	e := newRunEnv(t, 3, 0)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	empty := srfake.New() // knows no subject
	defer empty.Close()
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, bytes.Replace(demo.Projections, []byte("{balance: amount}"), []byte("{balance: amout}"), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"http address in use", e.args("busy", "--http-addr", busy.Addr().String()), "--http-addr " + busy.Addr().String()},
		{"API address in use", e.args("busyapi", "--api", "--auth", "none", "--api-addr", busy.Addr().String()), "--api-addr " + busy.Addr().String()},
		{"schema not registered", e.args("noschema", "--registry-url", empty.URL()), `projection "accounts"`},
		{"a field not in the schema", e.args("badfield", "--config", bad), `projection accounts: events.Deposited.add.balance: field "amout" is not in the reader schema`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := Main(t.Context(), tc.args, &out, &out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %q\n%s", err, tc.want, &out)
			}
			if tables := e.tables(t); len(tables) > 0 {
				t.Errorf("a run that failed to start created tables %v", tables)
			}
			identity := tc.args[slices.Index(tc.args, "--identity")+1]
			if slices.Contains(e.groups(t), identity) {
				t.Errorf("a run that failed to start joined group %q", identity)
			}
		})
	}
}

// TestDatabaseURLWithoutDatabaseIsRefused: a URL that names no database is
// refused with an error that says so, before anything connects.
func TestDatabaseURLWithoutDatabaseIsRefused(t *testing.T) {
	t.Setenv("PGDATABASE", "")
	config := filepath.Join(t.TempDir(), "projections.yaml")
	if err := os.WriteFile(config, demo.Projections, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, url := range []string{"postgres://", "postgres://postgres@127.0.0.1:5432", "postgresql://127.0.0.1/?sslmode=disable", "host=127.0.0.1 user=postgres"} {
		for _, cmd := range [][]string{
			{"migrate", "--config", config, "--database-url", url},
			{"run", "--brokers", "127.0.0.1:1", "--registry-url", "http://127.0.0.1:1", "--config", config, "--database-url", url},
			{"status", "--database-url", url},
		} {
			var out bytes.Buffer
			err := Main(t.Context(), cmd, &out, &out)
			if err == nil || !strings.Contains(err.Error(), "--database-url") || !strings.Contains(err.Error(), "names no database") {
				t.Errorf("projector %s: got %v, want it refused for naming no database", strings.Join(cmd, " "), err)
			}
		}
	}
}

// TestMigrateSaysWhereItWrites: migrate prints the host, port, database
// and schema it writes to, and never the password.
func TestMigrateSaysWhereItWrites(t *testing.T) {
	db := testenv.NewDB(t)
	config := filepath.Join(t.TempDir(), "projections.yaml")
	if err := os.WriteFile(config, demo.Projections, 0o600); err != nil {
		t.Fatal(err)
	}
	withPassword := strings.Replace(db.URL, "postgres@", "postgres:s3cr3t-pw@", 1)
	if withPassword == db.URL {
		t.Fatalf("test database URL %s has no user to add a password to", db.URL)
	}
	var out, errs bytes.Buffer
	if err := Main(t.Context(), []string{"migrate", "--database-url", withPassword, "--config", config}, &out, &errs); err != nil {
		t.Fatalf("migrate: %v\n%s", err, &errs)
	}
	for _, want := range []string{"host 127.0.0.1", "port 5432", `database "test"`, fmt.Sprintf("schema %q", db.Schema)} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("migrate output does not say %q:\n%s", want, &out)
		}
	}
	if strings.Contains(out.String()+errs.String(), "s3cr3t-pw") {
		t.Errorf("migrate printed the password:\n%s\n%s", &out, &errs)
	}
}

// TestRunSaysWhereItWrites: run logs the host, port, database and schema
// it writes to, and never the password.
func TestRunSaysWhereItWrites(t *testing.T) {
	e := newRunEnv(t, 2, 200)
	args := e.args("where")
	i := slices.Index(args, "--database-url")
	args[i+1] = strings.Replace(args[i+1], "postgres@", "postgres:s3cr3t-pw@", 1)
	r := start(t, args...)
	e.verify(t, "where", time.Minute, r.out)
	logs := r.out.String()
	for _, want := range []string{`"host":"127.0.0.1"`, `"port":5432`, `"database":"test"`, fmt.Sprintf(`"schema":%q`, e.db.Schema)} {
		if !strings.Contains(logs, want) {
			t.Errorf("run's log does not say %s:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "s3cr3t-pw") {
		t.Errorf("run logged the password:\n%s", logs)
	}
	r.stop()
	if err := r.exited(t, 30*time.Second); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("run did not stop cleanly: %v", err)
	}
}

// `projector run` against brokers that do not answer does not log
// "projector running" and then nothing: within seconds the Kafka client's
// warning, and the engine's own naming the seed brokers, once each.
func TestRunWithUnreachableBrokersSpeaks(t *testing.T) {
	e := newRunEnv(t, 1, 0)
	args := e.args("unreachable")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	args[slices.Index(args, "--brokers")+1] = dead
	r := start(t, args...)
	testenv.WaitFor(t, 30*time.Second, func() error {
		logs := r.out.String()
		for _, want := range []string{`"msg":"unable to open connection to broker"`, `"msg":"no Kafka broker answers (seed brokers ` + dead} {
			if !strings.Contains(logs, want) {
				return fmt.Errorf("no line %s in:\n%s", want, logs)
			}
		}
		return nil
	})
	if n := strings.Count(r.out.String(), "no Kafka broker answers"); n != 1 {
		t.Errorf("%d warnings that no broker answers, want 1:\n%s", n, r.out)
	}
}
