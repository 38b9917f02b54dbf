package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
)

// childEnv carries the arguments of a benchmark child started from this
// test binary: TestMain runs Main with them instead of the tests.
const childEnv = "PROJECTOR_BENCH_TEST_CHILD_ARGS"

func TestMain(m *testing.M) {
	if raw := os.Getenv(childEnv); raw != "" {
		var args []string
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			fmt.Fprintln(os.Stderr, "bad child args:", err)
			os.Exit(2)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := Main(ctx, args, os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "projector-bench:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// spawnTestChildren makes the benchmark start its children from this test
// binary (through TestMain) for the rest of the test, and returns the
// command lines they were started with.
func spawnTestChildren(t *testing.T) func() [][]string {
	t.Helper()
	var (
		mu      sync.Mutex
		started [][]string
	)
	old := benchSpawn
	benchSpawn = func(args []string) *exec.Cmd {
		raw, err := json.Marshal(args)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
		mu.Lock()
		started = append(started, append([]string{os.Args[0], "-test.run=^$"}, args...))
		mu.Unlock()
		return cmd
	}
	t.Cleanup(func() { benchSpawn = old })
	return func() [][]string {
		mu.Lock()
		defer mu.Unlock()
		return started
	}
}

// Bad flags get an error naming the flag, before anything runs.
func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--fresh-load", "0.25,1.5"}, "--fresh-load"},
		{[]string{"--fresh-load", "a quarter"}, "--fresh-load"},
		{[]string{"--aggregates", "10,none"}, "--aggregates"},
		{[]string{"--modes", "engine-fold,fastest"}, "--modes"},
		{[]string{"--state-cache-bytes", "lots"}, "-state-cache-bytes"},
		{[]string{"--events", "10", "extra"}, "unexpected arguments"},
		{[]string{"--database-url", "postgres://postgres@127.0.0.1:1/test?connect_timeout=2", "--events", "10"}, "--database-url"},
	} {
		var out bytes.Buffer
		err := Main(t.Context(), tc.args, &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("projector-bench %s: got error %v, want one naming %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}

// A password in --database-url never reaches the output or a child's
// command line (visible in ps).
func TestSecretsNeverPrinted(t *testing.T) {
	const secret = "Hunter2-p4ss"
	started := spawnTestChildren(t)
	u, err := url.Parse(testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("password", secret)
	u.RawQuery = q.Encode()
	var stdout, stderr bytes.Buffer
	err = Main(t.Context(), []string{"--modes", "limit", "--events", "2000", "--aggregates", "200",
		"--partitions", "2", "--database-url", u.String()}, &stdout, &stderr)
	out := stdout.String() + stderr.String()
	if err != nil {
		t.Fatalf("projector-bench: %v\n%s", err, out)
	}
	noSecret := func(what, s string) {
		t.Helper()
		if strings.Contains(s, secret) || strings.Contains(s, url.QueryEscape(secret)) {
			t.Errorf("%s printed the password:\n%s", what, s)
		}
	}
	noSecret("projector-bench", out)
	args := started()
	if len(args) == 0 {
		t.Fatal("projector-bench started no child")
	}
	for _, a := range args {
		noSecret("a benchmark child's command line", strings.Join(a, " "))
	}
}
