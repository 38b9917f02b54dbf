package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/projector-dev/projector/internal/cliflag"
	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/internal/testenv"
)

// TestDemo runs a smaller demo end to end: it must verify its own result,
// and its dead letters must be listed by `dlq list --json`.
func TestDemo(t *testing.T) {
	ctx := t.Context()
	schema := fmt.Sprintf("t_demo_%x", rand.Uint32())
	admin, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close) // after the drop below: cleanups run last first
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})

	var out, errs bytes.Buffer
	err = Main(ctx, []string{"demo", "--database-url", testenv.DatabaseURL(), "--database-schema", schema, "--aggregates", "2000"}, &out, &errs)
	if err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, &out, &errs)
	}
	for _, want := range []string{"member-2   joined", "summary", "verify     OK"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, &out)
		}
	}
	// The second member's join is told when it happens, mid-stream.
	join := regexp.MustCompile(`member-2   joined group "[^"]+" at [0-9.]+s, a third of the way in \(([0-9]+) of ([0-9]+) records sent\)`).FindStringSubmatch(out.String())
	if join == nil {
		t.Errorf("demo output does not say when member-2 joined:\n%s", &out)
	} else if sent, total := atoi(t, join[1]), atoi(t, join[2]); 3*sent < total || sent >= total {
		t.Errorf("member-2 joined after %d of %d records: want a third of the way in", sent, total)
	}

	// The commands the demo prints at its end work when pasted.
	pasted := regexp.MustCompile(`(?m)^ +projector (status --identity demo|dlq list) --database-url '([^']+)'$`).FindAllStringSubmatch(out.String(), -1)
	if len(pasted) != 2 {
		t.Fatalf("demo output does not end with the status and dlq commands to run next:\n%s", &out)
	}
	dbURL := pasted[0][2]
	if !strings.Contains(dbURL, schema) {
		t.Errorf("the printed --database-url %s does not name the demo's schema %s", dbURL, schema)
	}
	out.Reset()
	if err := Main(ctx, []string{"status", "--json", "--identity", "demo", "--database-url", dbURL}, &out, &errs); err != nil {
		t.Fatalf("status: %v\n%s", err, &errs)
	}
	var parts []partitionStatus
	if err := json.Unmarshal(out.Bytes(), &parts); err != nil {
		t.Fatalf("status --json: %v\n%s", err, &out)
	}
	if len(parts) == 0 || parts[0].Topic != demo.Topic || parts[0].NextOffset == nil || parts[0].State != stateLogNotAsked {
		t.Errorf("status with the printed --database-url: want the demo's stored offsets, got %+v", parts)
	}
	out.Reset()
	if err := Main(ctx, []string{"dlq", "list", "--json", "--database-url", pasted[1][2]}, &out, &errs); err != nil {
		t.Fatalf("dlq list: %v\n%s", err, &errs)
	}
	var dls []map[string]any
	if err := json.Unmarshal(out.Bytes(), &dls); err != nil {
		t.Fatalf("dlq list --json is not a JSON array: %v\n%s", err, &out)
	}
	if len(dls) != demo.DefaultOptions().Poison {
		t.Errorf("dlq list: %d entries, want %d poison pills", len(dls), demo.DefaultOptions().Poison)
	}
	for _, d := range dls {
		for _, field := range []string{"topic", "partition", "offset", "key", "error"} {
			if _, ok := d[field]; !ok {
				t.Errorf("dead letter %v lacks %q", d, field)
			}
		}
		if d["topic"] != demo.Topic || !strings.HasPrefix(d["key"].(string), "acc-") || d["error"] == "" {
			t.Errorf("dead letter does not name its record: %v", d)
		}
	}
}

// TestBadInputStopsWithAClearMessage checks that bad flags and projection
// files stop the command with an error naming what is wrong.
func TestBadInputStopsWithAClearMessage(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("projections:\n  - name: x\n    topic: t\n    table: x\n    key: id\n    mode: fold\n    type_field: type\n    columns:\n      id: {type: text, primary_key: true}\n    events:\n      Opened: {set: {nope: field}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--registry-url", "http://127.0.0.1:1"}, "--brokers"},
		{[]string{"run", "--brokers", "127.0.0.1:1"}, "--registry-url"},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--start-from", "middle"}, "--start-from"},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--group-protocol", "kip848"}, `--group-protocol "kip848": want classic or consumer`},
		{[]string{"dev", "--group-protocol", "Consumer"}, `--group-protocol "Consumer": want classic or consumer`},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--batch-max-records", "0"}, "--batch-max-records"},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--commit-max-batches", "0"}, "--commit-max-batches"},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--member-max-records", "-1"}, "--member-max-records"},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--state-cache-bytes", "lots"}, "-state-cache-bytes"},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--state-cache-bytes", "-5MiB"}, "-state-cache-bytes"},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--dead-letter-storm-share", "1.5"}, "-dead-letter-storm-share"},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--dead-letter-storm-share", "half"}, "-dead-letter-storm-share"},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--dead-letter-storm-window", "0"}, "--dead-letter-storm-window"},
		// The Kafka transport is checked before anything connects, by
		// every command that has it.
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--kafka-sasl-mechanism", "gssapi"}, `--kafka-sasl-mechanism "gssapi": want plain, scram-sha-256, scram-sha-512, oauthbearer or aws-msk-iam`},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--kafka-sasl-username", "u"}, "need --kafka-sasl-mechanism"},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--kafka-sasl-mechanism", "PLAIN"}, "--kafka-sasl-mechanism plain needs --kafka-sasl-username"},
		{[]string{"relay", "--brokers", "b", "--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-username", "u"}, "--kafka-sasl-mechanism scram-sha-512 needs --kafka-sasl-password"},
		{[]string{"produce", "--brokers", "b", "--topic", "t", "--tombstone", "k", "--kafka-tls-cert-file", "c.pem"}, "--kafka-tls-cert-file needs --kafka-tls-key-file"},
		{[]string{"status", "--brokers", "b", "--kafka-tls-key-file", "k.pem"}, "--kafka-tls-key-file needs --kafka-tls-cert-file"},
		{[]string{"offsets", "reset", "--brokers", "b", "--topic", "t", "--to-earliest", "--kafka-tls-ca-file", filepath.Join(dir, "no-ca.pem")}, "--kafka-tls-ca-file: open " + filepath.Join(dir, "no-ca.pem")},
		{[]string{"dlq", "replay", "--execute", "--brokers", "b", "--kafka-tls-ca-file", bad}, "--kafka-tls-ca-file " + bad + ": no PEM certificate in the file"},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--kafka-tls-cert-file", bad, "--kafka-tls-key-file", bad}, "--kafka-tls-cert-file " + bad + ", --kafka-tls-key-file " + bad},
		{[]string{"produce", "--topic", "t", "--key", "k", "--file", writeFile(t, "e.jsonl", "{}\n"), "--schema", "s.avsc", "--registry-url", "https://r", "--registry-tls-ca-file", bad}, "--registry-tls-ca-file " + bad + ": no PEM certificate"},
		// dev's embedded broker is plaintext.
		{[]string{"dev", "--kafka-tls"}, "flag provided but not defined: -kafka-tls"},
		// No authentication only when asked for by name.
		{[]string{"serve"}, "--auth tokens needs --auth-token-file (PROJECTOR_AUTH_TOKEN_FILE)"},
		{[]string{"serve", "--auth", "tokenz"}, `--auth "tokenz"`},
		{[]string{"serve", "--auth", "none", "--api-statement-timeout", "0s"}, "--api-statement-timeout"},
		{[]string{"serve", "--auth", "none", "--config", bad}, `events.Opened.set: no column "nope"`},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--api"}, "--auth tokens needs --auth-token-file (PROJECTOR_AUTH_TOKEN_FILE)"},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--api", "--auth", "none", "--api-max-conns", "0"}, "--api-max-conns"},
		{[]string{"run", "--brokers", "b", "--registry-url", "http://r", "--admin-api"}, "--admin-api: the admin API moved to --api-addr: drop --admin-api and add --api"},
		{[]string{"migrate", "--config", filepath.Join(dir, "missing.yaml")}, "missing.yaml"},
		{[]string{"migrate", "--config", bad}, `events.Opened.set: no column "nope"`},
		{[]string{"migrate", "--config", bad}, `projection "x"`},
		{[]string{"bench", "--events", "1000"}, "projector-bench"},
		{[]string{"demo", "--database-url", "postgres://postgres@127.0.0.1:1/test?connect_timeout=2"}, "cannot connect to PostgreSQL"},
		{[]string{"offsets", "reset", "--to-earliest"}, "--topic"},
		{[]string{"offsets", "reset", "--topic", "t"}, "--to-earliest"},
		{[]string{"offsets", "reset", "--topic", "t", "--to-earliest", "--to-latest"}, "exactly one"},
		{[]string{"offsets", "reset", "--topic", "t", "--to-offset", "-1"}, "-to-offset"},
		{[]string{"offsets", "reset", "--topic", "t", "--to-datetime", "yesterday"}, "--to-datetime"},
		{[]string{"offsets", "reset", "--topic", "t", "--to-earliest", "--partitions", "a"}, "--partitions"},
		{[]string{"offsets", "reset", "--topic", "t", "--to-earliest", "--partitions", "1,1"}, "--partitions"},
		// Filters are checked before anything is read: against a server
		// that is not there, the flag is still named.
		{[]string{"dlq", "list", "--error-class", "decoding", "--database-url", "postgres://postgres@127.0.0.1:1/test?connect_timeout=2"}, `--error-class "decoding": want one of decode, invalid`},
		{[]string{"dlq", "list", "--status", "dead", "--database-url", "postgres://postgres@127.0.0.1:1/test?connect_timeout=2"}, `--status "dead": want one of`},
		{[]string{"dlq", "purge", "--error-class", "decoding", "--yes", "--database-url", "postgres://postgres@127.0.0.1:1/test?connect_timeout=2"}, `--error-class "decoding"`},
	} {
		var out bytes.Buffer
		err := Main(t.Context(), tc.args, &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("projector %s: got error %v, want one naming %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}

// Sizes take the units operators write.
func TestByteSizeFlag(t *testing.T) {
	for in, want := range map[string]int64{"268435456": 256 << 20, "256MiB": 256 << 20, "256 MiB": 256 << 20, "1GiB": 1 << 30, "300MB": 300_000_000, "0": 0} {
		var b cliflag.ByteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("%q: got %d, %v; want %d", in, b, err, want)
		}
	}
}

// Shares are fractions of 1, and only off turns the guard off, which the
// engine reads as a negative share (its 0 is the default); a 0 is refused,
// since it reads as the strictest share rather than none.
func TestShareFlag(t *testing.T) {
	for in, want := range map[string]float64{"0.5": 0.5, "1": 1, "0.05": 0.05, "off": -1, "OFF": -1} {
		var s cliflag.Share
		if err := s.Set(in); err != nil || cliflag.ShareOff(s) != want {
			t.Errorf("%q: got %v, %v; want %v", in, cliflag.ShareOff(s), err, want)
		}
	}
	for _, in := range []string{"0", "0.0", "-0", "-0.1", "1.01", "NaN", "half", ""} {
		var s cliflag.Share
		if err := s.Set(in); err == nil {
			t.Errorf("%q: accepted as %v", in, s)
		}
	}
}

// TestStormShareZeroIsRefused: --dead-letter-storm-share 0 is a usage
// error on every command that has the flag, saying that off is the word
// that turns the guard off, instead of silently turning it off.
func TestStormShareZeroIsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"run", "--brokers", "127.0.0.1:1", "--registry-url", "http://127.0.0.1:1", "--dead-letter-storm-share", "0"},
		{"dev", "--dead-letter-storm-share", "0"},
		{"dev", "--dead-letter-storm-share", "0.0"},
	} {
		var out syncBuffer
		err := Main(t.Context(), args, &out, &out)
		if exitCode(err) != exitUsage || err == nil || !strings.Contains(err.Error(), "--dead-letter-storm-share") || !strings.Contains(err.Error(), "write off") {
			t.Errorf("projector %s: got %v (exit %d), want a usage error saying to write off", strings.Join(args, " "), err, exitCode(err))
		}
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// command is one command of the tree, by its path.
type command struct {
	path []string // after "projector"
	cmd  *ffcli.Command
}

// commands walks the whole command tree, so that a command added later
// is held to the conventions without a line here.
func commands() []command {
	var out []command
	var walk func(path []string, c *ffcli.Command)
	walk = func(path []string, c *ffcli.Command) {
		if c.Name == "bench" {
			return // answers every invocation with where the benchmark went
		}
		out = append(out, command{path: path, cmd: c})
		for _, sub := range c.Subcommands {
			walk(append(slices.Clip(path), sub.Name), sub)
		}
	}
	walk(nil, rootCommand(io.Discard, io.Discard))
	return append(out, command{path: []string{"help"}})
}

// TestCommandLineConventions holds every command to the same conventions:
// help exits 0, a mistake in the command line is one line that says what
// is wrong and exits 2, without the whole usage.
func TestCommandLineConventions(t *testing.T) {
	// Nothing below may get as far as connecting; if a command did, it
	// would fail fast rather than find the shared database.
	t.Setenv("PROJECTOR_DATABASE_URL", "postgres://postgres@127.0.0.1:1/test?connect_timeout=1")
	t.Setenv("PROJECTOR_BROKERS", "127.0.0.1:1")
	t.Setenv("PROJECTOR_REGISTRY_URL", "http://127.0.0.1:1")
	type result struct {
		err            error
		stdout, stderr string
	}
	projector := func(args ...string) result {
		var out, errs bytes.Buffer
		err := Main(t.Context(), args, &out, &errs)
		return result{err, out.String(), errs.String()}
	}
	// wrong checks a command line that must fail with exit 2 and a
	// message containing want, printing nothing else.
	wrong := func(t *testing.T, want string, args ...string) {
		t.Helper()
		r := projector(args...)
		if r.err == nil || exitCode(r.err) != exitUsage || !strings.Contains(r.err.Error(), want) {
			t.Errorf("projector %s: got error %v (exit %d), want exit 2 and %q", strings.Join(args, " "), r.err, exitCode(r.err), want)
		}
		if r.stdout != "" || r.stderr != "" {
			t.Errorf("projector %s printed more than its error:\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.stdout, r.stderr)
		}
	}

	for _, c := range commands() {
		name := strings.Join(append([]string{"projector"}, c.path...), " ")
		t.Run(name, func(t *testing.T) {
			for _, args := range [][]string{
				append(slices.Clip(c.path), "--help"),
				append(slices.Clip(c.path), "-h"),
				append([]string{"help"}, c.path...),
			} {
				r := projector(args...)
				if r.err != nil || !strings.Contains(r.stdout, "USAGE\n  "+name) {
					t.Errorf("projector %s: got error %v and stdout\n%s\nwant the usage of %s and exit 0", strings.Join(args, " "), r.err, r.stdout, name)
				}
			}
			if c.cmd == nil {
				return // help: it takes any command's path
			}

			if len(c.cmd.Subcommands) > 0 {
				sub := c.cmd.Subcommands[0]
				if len(c.path) > 0 { // projector dlq help list
					r := projector(append(slices.Clip(c.path), "help", sub.Name)...)
					if r.err != nil || !strings.Contains(r.stdout, "USAGE\n  "+name+" "+sub.Name) {
						t.Errorf("%s help %s: got error %v and stdout\n%s\nwant its usage and exit 0", name, sub.Name, r.err, r.stdout)
					}
				}
				r := projector(c.path...)
				if exitCode(r.err) != exitUsage || !silent(r.err) || !strings.Contains(r.stderr, "USAGE\n  "+name) {
					t.Errorf("%s alone: got error %v (exit %d), stderr\n%s\nwant its usage on stderr and exit 2", name, r.err, exitCode(r.err), r.stderr)
				}
				typo := sub.Name[:len(sub.Name)-1] + "x" // one letter wrong
				full := strings.Join(append(slices.Clip(c.path), sub.Name), " ")
				wrong(t, fmt.Sprintf(`unknown command %q: did you mean %q?`, strings.Join(append(slices.Clip(c.path), typo), " "), full), append(slices.Clip(c.path), typo)...)
				wrong(t, "unknown command", append(slices.Clip(c.path), "zzzzzzzzzz")...)
				return
			}

			if !takesArgs[name] {
				wrong(t, `unexpected argument "extra"; see `+name+" --help", append(slices.Clip(c.path), "extra")...)
			}
			wrong(t, "-no-such-flag; see "+name+" --help", append(slices.Clip(c.path), "--no-such-flag")...)
			c.cmd.FlagSet.VisitAll(func(f *flag.Flag) {
				flagArgs := func(v string) []string { return append(slices.Clip(c.path), "--"+f.Name, v) }
				switch v := f.Value.(type) {
				case *cliflag.ByteSize:
					wrong(t, fmt.Sprintf(`invalid value "lots" for --%s: a size like 64MiB`, f.Name), flagArgs("lots")...)
				case flag.Getter:
					if _, ok := v.Get().(time.Duration); !ok {
						return
					}
					wrong(t, fmt.Sprintf(`invalid value "5" for --%s: a duration like 500ms, 5s or 2m`, f.Name), flagArgs("5")...)
					allowed := zeroDurations[f.Name]
					if !allowed.zero {
						wrong(t, fmt.Sprintf(`invalid value "0" for --%s: must be positive`, f.Name), flagArgs("0")...)
					}
					if !allowed.negative {
						wrong(t, fmt.Sprintf(`invalid value "-1s" for --%s: must not be negative`, f.Name), flagArgs("-1s")...)
					}
				}
			})
		})
	}

	// The same words for a value from the environment.
	t.Run("environment", func(t *testing.T) {
		t.Setenv("PROJECTOR_BATCH_MAX_WAIT", "5")
		wrong(t, `invalid value "5" for --batch-max-wait: a duration like 500ms, 5s or 2m`, "run")
	})
	t.Run("dlq show", func(t *testing.T) {
		wrong(t, "want exactly one argument", "dlq", "show")
		wrong(t, "want exactly one argument", "dlq", "show", "1", "2")
		wrong(t, `ID "x" is not a dead-letter id`, "dlq", "show", "x")
		wrong(t, "-no-such-flag; see projector dlq show --help", "dlq", "show", "1", "--no-such-flag")
	})
	t.Run("typos", func(t *testing.T) {
		wrong(t, `unknown command "rnu": did you mean "run"?`, "rnu")
		wrong(t, `unknown command "dlq lsit": did you mean "dlq list"?`, "dlq", "lsit")
		wrong(t, `unknown command "stat": did you mean "status"?`, "stat")
		wrong(t, `unknown command "dlq lsit": did you mean "dlq list"?`, "help", "dlq", "lsit")
	})
}

// TestMissingEngineTables: the operator commands, pointed at a schema
// where projector migrate never ran, say so and what to do, instead of
// PostgreSQL's "relation does not exist".
func TestMissingEngineTables(t *testing.T) {
	t.Setenv("PROJECTOR_BROKERS", "127.0.0.1:1") // for the commands that need one
	db := testenv.NewDB(t)
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("no projector tables in %s/%s: run projector migrate, or check --database-url", strings.TrimPrefix(u.Path, "/"), db.Schema)
	for _, args := range [][]string{
		{"status"},
		{"offsets", "list"},
		{"offsets", "reset", "--topic", "t", "--to-earliest"},
		{"offsets", "audit"},
		{"dlq", "list"},
		{"dlq", "show", "1"},
		{"dlq", "replay", "--id", "1"},
		{"dlq", "purge", "--id", "1", "--yes"},
		{"dlq", "audit"},
	} {
		var out bytes.Buffer
		err := Main(t.Context(), append(slices.Clip(args), "--database-url", db.URL), &out, &out)
		if err == nil || err.Error() != want {
			t.Errorf("projector %s: got %v, want %q", strings.Join(args, " "), err, want)
		}
	}

	// A schema migrated by a version without one of the tables names it.
	if err := Main(t.Context(), []string{"migrate", "--database-url", db.URL, "--config", "../../examples/projections.yaml"}, io.Discard, io.Discard); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if _, err := db.Pool.Exec(t.Context(), "DROP TABLE projector_dlq_audit"); err != nil {
		t.Fatal(err)
	}
	err = Main(t.Context(), []string{"dlq", "audit", "--database-url", db.URL}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "no table projector_dlq_audit in ") || !strings.Contains(err.Error(), "run projector migrate") {
		t.Errorf("dlq audit without its table: got %v, want it named, with what to do", err)
	}
	if err := Main(t.Context(), []string{"dlq", "list", "--database-url", db.URL}, io.Discard, io.Discard); err != nil {
		t.Errorf("dlq list, whose table is there: %v", err)
	}
}

// The demo's URL for the commands after it keeps the user's settings,
// adds the schema in a form psql reads too, and never shows a password.
func TestWithSearchPath(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:secret@db:5432/app?sslmode=disable":                  "postgres://u:xxxxx@db:5432/app?options=-csearch_path%3Dprojector_demo&sslmode=disable",
		"postgres://u@db/app?search_path=other&options=-cwork_mem%3D64MB":  "postgres://u@db/app?options=-cwork_mem%3D64MB+-csearch_path%3Dprojector_demo",
		"postgres://u@db/app?options=-csearch_path%3Dprojector_demo":       "postgres://u@db/app?options=-csearch_path%3Dprojector_demo",
		"postgres://u@db/app?options=-csearch_path%3Dold+-cwork_mem%3D1MB": "postgres://u@db/app?options=-cwork_mem%3D1MB+-csearch_path%3Dprojector_demo",
		"host=db dbname=app password=secret":                               "host=db dbname=app password=xxxxx options='-csearch_path=projector_demo'",
	} {
		got := withSearchPath(in, "projector_demo")
		if r := redact.String(got); r != want {
			t.Errorf("%s: got %s, want %s", in, r, want)
		}
		cfg, err := pgxpool.ParseConfig(got)
		if err != nil || !strings.Contains(cfg.ConnConfig.RuntimeParams["options"], "-csearch_path=projector_demo") {
			t.Errorf("%s: pgx reads %v, %v: want the search path in options", got, cfg, err)
		}
	}
}

// TestDryRunOf: dlq replay and redrive are dry runs unless --execute,
// which --dry-run=true contradicts.
func TestDryRunOf(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    bool
		wantErr bool
	}{
		{nil, true, false},
		{[]string{"--execute"}, false, false},
		{[]string{"--dry-run=false"}, false, false},
		{[]string{"--execute", "--dry-run=false"}, false, false},
		{[]string{"--execute", "--dry-run=true"}, false, true},
	} {
		fs := flag.NewFlagSet("dlq", flag.ContinueOnError)
		dryRun := fs.Bool("dry-run", true, "")
		execute := fs.Bool("execute", false, "")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		got, err := dryRunOf(fs, *dryRun, *execute)
		if (err != nil) != tc.wantErr || err == nil && got != tc.want {
			t.Errorf("%q: dry run %v, %v; want %v (error %v)", tc.args, got, err, tc.want, tc.wantErr)
		}
	}
}
