package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/peterbourgon/ff/v3/ffcli"
)

// walkFlags calls fn for every flag of every command under root, with the
// command's path ("projector dlq list").
func walkFlags(root *ffcli.Command, fn func(path string, cmd *ffcli.Command, f *flag.Flag)) {
	var walk func(path string, c *ffcli.Command)
	walk = func(path string, c *ffcli.Command) {
		if c.FlagSet != nil {
			c.FlagSet.VisitAll(func(f *flag.Flag) { fn(path, c, f) })
		}
		for _, sub := range c.Subcommands {
			walk(path+" "+sub.Name, sub)
		}
	}
	walk("projector", root)
}

// TestEnvOneMeaning holds every environment variable to one meaning: no
// variable is read by two flags of different defaults or usage texts,
// every confirmation of a destructive action is a command-line flag only,
// and no usage names a variable by hand, where it could drift from the
// one the flag reads.
func TestEnvOneMeaning(t *testing.T) {
	type reader struct{ path, flag, def, usage string }
	byVar := map[string]reader{}
	commands := map[string]*ffcli.Command{}
	walkFlags(rootCommand(io.Discard, io.Discard), func(path string, cmd *ffcli.Command, f *flag.Flag) {
		commands[strings.TrimPrefix(path, "projector ")] = cmd
		if strings.Contains(f.Usage, envPrefix) {
			t.Errorf("%s --%s: its usage names an environment variable by hand; --help adds the one it reads: %q", path, f.Name, f.Usage)
		}
		v := envVar(path, f.Name)
		if v == "" {
			if _, isBool := f.Value.(interface{ IsBoolFlag() bool }); !isBool {
				t.Errorf("%s --%s is command line only but not a switch", path, f.Name)
			}
			return
		}
		r := reader{path, f.Name, f.DefValue, f.Usage}
		if first, ok := byVar[v]; ok && (first.def != r.def || first.usage != r.usage) {
			t.Errorf("%s is read by %s --%s (default %q: %s) and by %s --%s (default %q: %s): one variable, two meanings; give one of them its command's name in ownEnv",
				v, first.path, first.flag, first.def, first.usage, r.path, r.flag, r.def, r.usage)
			return
		}
		byVar[v] = r
	})
	// Every entry of ownEnv names a flag that exists, so that the table
	// says what the commands do.
	for cmd, names := range ownEnv {
		c := commands[cmd]
		for _, name := range names {
			if c == nil || c.FlagSet.Lookup(name) == nil {
				t.Errorf("ownEnv names %s --%s, which does not exist", cmd, name)
			}
		}
	}
	for _, name := range []string{"execute", "dry-run", "yes"} {
		if envVar("projector dlq replay", name) != "" || envVar("projector offsets reset", name) != "" || envVar("projector dlq purge", name) != "" {
			t.Errorf("--%s reads the environment", name)
		}
	}
}

// TestEnvHelpNamesVariables runs --help of every command: each flag's
// line names the variable it reads, or says it is command line only.
func TestEnvHelpNamesVariables(t *testing.T) {
	walked := map[string]bool{}
	walkFlags(rootCommand(io.Discard, io.Discard), func(path string, _ *ffcli.Command, f *flag.Flag) {
		walked[path] = true
	})
	for path := range walked {
		var out bytes.Buffer
		args := append(strings.Fields(path)[1:], "--help")
		if err := Main(t.Context(), args, &out, io.Discard); err != nil {
			t.Fatalf("%s --help: %v", path, err)
		}
		fs := flag.NewFlagSet("", flag.ContinueOnError)
		walkFlags(rootCommand(io.Discard, io.Discard), func(p string, _ *ffcli.Command, f *flag.Flag) {
			if p == path {
				fs.Var(f.Value, f.Name, f.Usage)
			}
		})
		fs.VisitAll(func(f *flag.Flag) {
			want := "(" + envNote(path, f.Name) + ")"
			// The flag's block: from its name to the next flag's.
			block := out.String()
			loc := regexp.MustCompile(`\n\s+-` + regexp.QuoteMeta(f.Name) + `[ =\n]`).FindStringIndex(block)
			if loc == nil {
				t.Errorf("%s --help does not list --%s:\n%s", path, f.Name, out.String())
				return
			}
			block = block[loc[0]+1:]
			if j := strings.Index(block, "\n  -"); j >= 0 {
				block = block[:j]
			}
			if !strings.Contains(strings.Join(strings.Fields(block), " "), want) {
				t.Errorf("%s --help: --%s does not say %s:\n%s", path, f.Name, want, block)
			}
		})
	}
	// The variables that changed name, as --help shows them.
	for _, tc := range []struct{ args []string }{
		{[]string{"relay", "--help"}},
		{[]string{"produce", "--help"}},
		{[]string{"dlq", "replay", "--help"}},
	} {
		var out bytes.Buffer
		if err := Main(t.Context(), tc.args, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		for _, want := range map[string][]string{
			"relay":   {"(PROJECTOR_RELAY_UNREADY_AFTER)", "(PROJECTOR_DATABASE_URL)"},
			"produce": {"(PROJECTOR_PRODUCE_TOPIC)", "(PROJECTOR_PRODUCE_TIMEOUT)", "(PROJECTOR_PRODUCE_KEY)"},
			"dlq":     {"(PROJECTOR_DLQ_REPLAY_TOPIC)", "(PROJECTOR_DLQ_REPLAY_LIMIT)", "(command line only)"},
		}[tc.args[0]] {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%s does not show %s:\n%s", strings.Join(tc.args, " "), want, out.String())
			}
		}
	}
}

// applied is the command tree as execute prepares it, for reading the
// environment into one command's flags.
func applied(t *testing.T, stderr io.Writer) (*cli, map[string]*ffcli.Command) {
	t.Helper()
	root := rootCommand(io.Discard, stderr)
	c := &cli{stdout: io.Discard, stderr: stderr, paths: map[*ffcli.Command]string{}, knownEnv: map[string]bool{}}
	c.apply(root, root.Name)
	cmds := map[string]*ffcli.Command{}
	for cmd, path := range c.paths {
		cmds[path] = cmd
	}
	return c, cmds
}

// TestEnvPerCommandNames: relay's --unready-after and run's are set by
// their own variables, each leaving the other's flag alone.
func TestEnvPerCommandNames(t *testing.T) {
	t.Setenv("PROJECTOR_UNREADY_AFTER", "41s")
	t.Setenv("PROJECTOR_RELAY_UNREADY_AFTER", "7s")
	t.Setenv("PROJECTOR_PRODUCE_TOPIC", "orders")
	var stderr bytes.Buffer
	c, cmds := applied(t, &stderr)
	for _, tc := range []struct{ path, flag, want string }{
		{"projector run", "unready-after", "41s"},
		{"projector relay", "unready-after", "7s"},
		{"projector produce", "topic", "orders"},
		{"projector dlq list", "topic", ""},
		{"projector offsets reset", "topic", ""},
	} {
		fs := cmds[tc.path].FlagSet
		if err := c.readEnv(tc.path, fs); err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		if got := fs.Lookup(tc.flag).Value.String(); got != tc.want {
			t.Errorf("%s --%s = %q, want %q", tc.path, tc.flag, got, tc.want)
		}
	}
	if stderr.Len() != 0 {
		t.Errorf("variables some command reads were warned about:\n%s", &stderr)
	}

	// A variable that named relay's flag before it had its own name is
	// not read by relay, which says which one is.
	os.Unsetenv("PROJECTOR_UNREADY_AFTER") // restored by t.Setenv's cleanup
	t.Setenv("PROJECTOR_PRODUCE_TOPIC", "")
	t.Setenv("PROJECTOR_TOPIC", "orders")
	stderr.Reset()
	c, cmds = applied(t, &stderr)
	if err := c.readEnv("projector produce", cmds["projector produce"].FlagSet); err != nil {
		t.Fatal(err)
	}
	if got := cmds["projector produce"].FlagSet.Lookup("topic").Value.String(); got != "" {
		t.Errorf("produce read PROJECTOR_TOPIC: --topic %q", got)
	}
	if want := "projector: unknown environment variable PROJECTOR_TOPIC ignored: produce's --topic reads PROJECTOR_PRODUCE_TOPIC\n"; stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}
}

// TestEnvUnknownVariables: a misspelt variable is refused before anything
// runs, another unknown one is warned about once, and the names the
// repository's scripts and tests use, or another command reads, are
// neither.
func TestEnvUnknownVariables(t *testing.T) {
	run := func(args ...string) (stdout, stderr string, err error) {
		var o, e bytes.Buffer
		err = Main(t.Context(), args, &o, &e)
		return o.String(), e.String(), err
	}
	dir := t.TempDir()
	config := filepath.Join(dir, "projections.yaml")
	if err := os.WriteFile(config, []byte("not: [a projection file\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("misspelt", func(t *testing.T) {
		t.Setenv("PROJECTOR_DATABSE_URL", "postgres://postgres@127.0.0.1:1/prod")
		stdout, stderr, err := run("check", "--config", config, "--no-database")
		want := "unknown environment variable PROJECTOR_DATABSE_URL: did you mean PROJECTOR_DATABASE_URL?"
		if err == nil || err.Error() != want || exitCode(err) != exitUsage {
			t.Fatalf("error %v (exit %d), want %q with exit %d", err, exitCode(err), want, exitUsage)
		}
		if stdout != "" || stderr != "" {
			t.Errorf("the command ran: stdout %q, stderr %q", stdout, stderr)
		}
		// Wherever the letters are wrong.
		t.Setenv("PROJECTOR_DATABSE_URL", "")
		t.Setenv("PROJECTOR_BROKER", "kafka:9092")
		if _, _, err := run("check", "--config", config, "--no-database"); err == nil || !strings.Contains(err.Error(), "did you mean PROJECTOR_BROKERS?") {
			t.Errorf("PROJECTOR_BROKER: %v", err)
		}
	})

	t.Run("unknown", func(t *testing.T) {
		t.Setenv("PROJECTOR_FAVOURITE_COLOUR", "blue")
		t.Setenv("PROJECTOR_HTTP_PORT", "8080") // not Kubernetes': its value is no tcp:// address
		_, stderr, err := run("check", "--config", config, "--no-database")
		if err == nil || exitCode(err) == exitUsage {
			t.Errorf("check of a broken file: %v, want it to run and fail", err)
		}
		want := "projector: unknown environment variable PROJECTOR_FAVOURITE_COLOUR ignored: no command reads it\n"
		if strings.Count(stderr, "PROJECTOR_FAVOURITE_COLOUR") != 1 || !strings.Contains(stderr, want) {
			t.Errorf("stderr:\n%s\nwant the line %q once", stderr, want)
		}
		if strings.Count(stderr, "PROJECTOR_HTTP_PORT") != 1 {
			t.Errorf("stderr:\n%s\nwant one line about PROJECTOR_HTTP_PORT", stderr)
		}
	})

	t.Run("known", func(t *testing.T) {
		// Another command's (a deployment shares one environment
		// between run and relay), and the scripts' and tests'.
		t.Setenv("PROJECTOR_RELAY_UNREADY_AFTER", "5s")
		t.Setenv("PROJECTOR_SESSION_TIMEOUT", "45s")
		for _, name := range reservedEnv {
			if strings.HasSuffix(name, "_") {
				name += "RUNS" // a family: any name it begins
			}
			t.Setenv(name, "1")
		}
		// What Kubernetes gives every pod for the Services projector and
		// projector-relay of its namespace.
		for name, value := range map[string]string{
			"PROJECTOR_SERVICE_HOST":        "10.0.0.7",
			"PROJECTOR_SERVICE_PORT":        "8080",
			"PROJECTOR_SERVICE_PORT_HTTP":   "8080",
			"PROJECTOR_PORT":                "tcp://10.0.0.7:8080",
			"PROJECTOR_PORT_8080_TCP":       "tcp://10.0.0.7:8080",
			"PROJECTOR_PORT_8080_TCP_PROTO": "tcp",
			"PROJECTOR_PORT_8080_TCP_PORT":  "8080",
			"PROJECTOR_PORT_8080_TCP_ADDR":  "10.0.0.7",
			"PROJECTOR_RELAY_SERVICE_HOST":  "10.0.0.8",
			"PROJECTOR_RELAY_PORT":          "tcp://10.0.0.8:8080",
		} {
			t.Setenv(name, value)
		}
		t.Setenv("PROJECTOR_EXECUTE", "true") // said only by the commands that have --execute
		_, stderr, err := run("check", "--config", config, "--no-database")
		if err == nil || exitCode(err) == exitUsage {
			t.Errorf("check of a broken file: %v, want it to run and fail", err)
		}
		if strings.Contains(stderr, "environment variable") || strings.Contains(stderr, "PROJECTOR_") {
			t.Errorf("known variables were warned about:\n%s", stderr)
		}
	})
}

// TestEnvNamesInTheRepository: every PROJECTOR_ name that the docs, the
// deployment files, the scripts and the tests write is one a command reads
// or one reservedEnv lists, so that a renamed variable does not live on in
// a recipe that then sets nothing, and the scripts' own names are never
// warned about.
func TestEnvNamesInTheRepository(t *testing.T) {
	c, _ := applied(t, io.Discard)
	ignoredOK := map[string]bool{}
	for name := range commandLineOnly {
		ignoredOK[envPrefix+envWord(name)] = true
	}
	ignoredOK["PROJECTOR_TAKE_OVER_IDENTITY"] = true
	// A name that stands for a pattern, and the misspelling the docs show.
	ignoredOK["PROJECTOR_KAFKA_"] = true
	ignoredOK["PROJECTOR_DATABSE_URL"] = true
	ignoredOK["PROJECTOR_PORT"] = true // Kubernetes', told by its tcp:// value
	nameRE := regexp.MustCompile(`PROJECTOR_[A-Z0-9_]+`)
	var files []string
	for _, pattern := range []string{"../../docs/*.md", "../../README.md", "../../deploy/*", "../../deploy/*/*", "../../examples/*", "../../docker-compose.yml", "../../Makefile", "../../scripts/*", "../../internal/testenv/*.go", "*_test.go", "*.go"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	for _, file := range files {
		if strings.HasSuffix(file, "env_test.go") || strings.HasSuffix(file, "env.go") || strings.HasSuffix(file, "configuration.md") {
			continue // configuration.md names the former variables, and TestConfigReference holds it to the code
		}
		b, err := os.ReadFile(file)
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				continue // a directory
			}
			t.Fatal(err)
		}
		names := nameRE.FindAllString(string(b), -1)
		slices.Sort(names)
		for _, name := range slices.Compact(names) {
			if !c.knownEnv[name] && !reserved(name) && !ignoredOK[name] && !serviceLinkName.MatchString(name) {
				t.Errorf("%s names %s, which no command reads and reservedEnv does not list", file, name)
			}
		}
	}
}

// TestEnvDoesNotConfirm: with PROJECTOR_EXECUTE=true or
// PROJECTOR_DRY_RUN=false in the environment, offsets reset and dlq
// replay only print their plan, change and publish nothing, and say once
// that they ignore the variable.
func TestEnvDoesNotConfirm(t *testing.T) {
	confirmations := []map[string]string{
		{"PROJECTOR_EXECUTE": "true"},
		{"PROJECTOR_DRY_RUN": "false"},
		{"PROJECTOR_EXECUTE": "true", "PROJECTOR_DRY_RUN": "false"},
	}
	setenv := func(t *testing.T, vars map[string]string) {
		for _, name := range []string{"PROJECTOR_EXECUTE", "PROJECTOR_DRY_RUN"} {
			t.Setenv(name, vars[name])
		}
	}
	// offsets reset has no --dry-run: PROJECTOR_DRY_RUN is nothing to it.
	saysIgnored := func(t *testing.T, stderr string, vars map[string]string, flags ...string) {
		t.Helper()
		for name := range vars {
			if !slices.Contains(flags, name) {
				continue
			}
			if n := strings.Count(stderr, name+" is ignored: "); n != 1 {
				t.Errorf("stderr says %d times that %s is ignored, want once:\n%s", n, name, stderr)
			}
		}
	}

	t.Run("offsets reset", func(t *testing.T) {
		e := newOffsetsEnv(t, 1)
		e.produce(0, "acc-", 0, 10, nil)
		_, stop := e.engine(nil)
		e.waitStored(0, 10)
		stop()
		_, epoch := e.stored(0)
		for _, vars := range confirmations {
			setenv(t, vars)
			var stdout, stderr bytes.Buffer
			args := []string{"offsets", "reset", "--topic", e.kafka.Topic, "--to-earliest",
				"--brokers", e.kafka.Brokers(), "--database-url", e.db.URL, "--identity", e.identity}
			if err := Main(t.Context(), args, &stdout, &stderr); err != nil {
				t.Fatalf("offsets reset with %v: %v\n%s", vars, err, &stderr)
			}
			if !strings.Contains(stdout.String(), "dry run") {
				t.Errorf("offsets reset with %v did not dry-run:\n%s", vars, &stdout)
			}
			if next, ep := e.stored(0); orDash(next) != "10" || ep != epoch || e.resets() != 0 {
				t.Fatalf("offsets reset with %v moved the stored offset to %s at epoch %d (was 10 at %d), or audited it", vars, orDash(next), ep, epoch)
			}
			saysIgnored(t, stderr.String(), vars, "PROJECTOR_EXECUTE")
		}
	})

	t.Run("dlq replay", func(t *testing.T) {
		e := newDLQEnv(t)
		for _, vars := range confirmations {
			setenv(t, vars)
			var stdout, stderr bytes.Buffer
			args := []string{"dlq", "replay", "--id", e.id("good"), "--brokers", e.brokers, "--database-url", e.db.URL}
			if err := Main(t.Context(), args, &stdout, &stderr); err != nil {
				t.Fatalf("dlq replay with %v: %v\n%s", vars, err, &stderr)
			}
			if !strings.Contains(stdout.String(), "dry run") {
				t.Errorf("dlq replay with %v did not dry-run:\n%s", vars, &stdout)
			}
			if n := e.produced(); n != 0 {
				t.Fatalf("dlq replay with %v produced %d records", vars, n)
			}
			if a := e.audit(); len(a) != 0 {
				t.Fatalf("dlq replay with %v audited: %+v", vars, a)
			}
			if d := dlqStatus(t, e.db.Pool, e.ids["good"]); d.Status != "open" || d.Replays != 0 {
				t.Fatalf("dlq replay with %v changed the entry: %+v", vars, d)
			}
			saysIgnored(t, stderr.String(), vars, "PROJECTOR_EXECUTE", "PROJECTOR_DRY_RUN")
		}
		// The command line still confirms.
		if out := e.mustRun("dlq", "replay", "--id", e.id("good"), "--brokers", e.brokers, "--execute"); e.produced() != 1 {
			t.Errorf("dlq replay --execute produced %d records, want 1:\n%s", e.produced(), out)
		}
	})
}
