package main

import (
	"bytes"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
)

// TestMain lets a test start this binary as a benchmark child (see
// spawnTestChildren).
func TestMain(m *testing.M) { testenv.RunTests(m, "projector-bench", Main) }

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
		cmd := testenv.ChildCommand(t, args...)
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
		{[]string{"--rebuild-rate", "-1"}, "--rebuild-rate"},
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

// The benchmark reads PROJECTOR_BENCH_<FLAG>, not projector's variables,
// which mean other things (projector's --partitions is not the
// benchmark's), and --help names each flag's variable.
func TestBenchEnvironment(t *testing.T) {
	t.Setenv("PROJECTOR_EVENTS", "ten")
	t.Setenv("PROJECTOR_LOG_LEVEL", "nonsense")
	var out bytes.Buffer
	if err := Main(t.Context(), []string{"--modes", "fastest"}, &out, &out); err == nil || !strings.Contains(err.Error(), "--modes") {
		t.Errorf("with projector's variables set: error %v, want the one about --modes", err)
	}
	t.Setenv("PROJECTOR_BENCH_EVENTS", "ten")
	if err := Main(t.Context(), nil, &out, &out); err == nil || !strings.Contains(err.Error(), "PROJECTOR_BENCH_EVENTS") {
		t.Errorf("PROJECTOR_BENCH_EVENTS=ten: error %v, want one naming the variable", err)
	}
	out.Reset()
	if err := Main(t.Context(), []string{"--help"}, &out, &out); err == nil {
		t.Fatal("--help: no flag.ErrHelp")
	}
	for _, want := range []string{"(PROJECTOR_BENCH_EVENTS)", "(PROJECTOR_BENCH_PARTITIONS)", "(PROJECTOR_DATABASE_URL)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help does not show %s:\n%s", want, &out)
		}
	}
}
