package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/internal/testenv"
)

// readmeBlocks returns the README's fenced code blocks that follow a
// "<!-- journey: NAME -->" line, by NAME.
func readmeBlocks(t *testing.T) map[string]string {
	t.Helper()
	text, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	marker := regexp.MustCompile(`(?m)^<!-- journey: (\S+) -->\n` + "```" + `[a-z]*\n((?s:.*?))` + "```" + `\n`)
	out := map[string]string{}
	for _, m := range marker.FindAllStringSubmatch(string(text), -1) {
		out[m[1]] = m[2]
	}
	return out
}

// withFlags returns args with each flag of set given that value, replacing
// the README's value or appended when the README has none.
func withFlags(args []string, set map[string]string) []string {
	out := slices.Clone(args)
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range set {
			if !yield(k) {
				return
			}
		}
	}) {
		if i := slices.Index(out, "--"+name); i >= 0 && i+1 < len(out) {
			out[i+1] = set[name]
			continue
		}
		out = append(out, "--"+name, set[name])
	}
	return out
}

// TestReadmeJourney runs the README's five-minute path as it is written:
// the projection file, schema and events of its code blocks, projector dev,
// produce, the psql query (its rows must equal the README's), status and
// dlq list; addresses and the database are the test's own.
func TestReadmeJourney(t *testing.T) {
	blocks := readmeBlocks(t)
	for _, name := range []string{"projections.yaml", "account.avsc", "events.jsonl", "shell", "psql-output"} {
		if blocks[name] == "" {
			t.Fatalf("README has no code block marked <!-- journey: %s -->", name)
		}
	}
	dir := t.TempDir()
	for _, name := range []string{"projections.yaml", "account.avsc", "events.jsonl"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(blocks[name]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// File names on the README's command lines are relative to where the
	// user wrote the files.
	inDir := func(args []string) []string {
		out := slices.Clone(args)
		for i, a := range out {
			if p := filepath.Join(dir, a); !strings.HasPrefix(a, "-") && fileExists(p) {
				out[i] = p
			}
		}
		return out
	}
	db := testenv.NewDB(t)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var (
		devOut, devErr syncBuffer
		devDone        = make(chan error, 1)
		brokers        string
		registryURL    string
		started        bool
	)
	// Stop dev before the test's schema is dropped.
	defer func() {
		if started {
			cancel()
			if err := <-devDone; err != nil {
				t.Errorf("projector dev did not stop cleanly on cancel: %v\n%s", err, devErr.String())
			}
		}
	}()
	devRunning := func() {
		t.Helper()
		testenv.WaitFor(t, 30*time.Second, func() error {
			select {
			case err := <-devDone:
				started = false
				t.Fatalf("projector dev ended: %v\nstdout:\n%s\nstderr:\n%s", err, devOut.String(), devErr.String())
			default:
			}
			if !strings.Contains(devOut.String(), "running; next") {
				return fmt.Errorf("dev has not said it is running:\n%s", devOut.String())
			}
			return nil
		})
		out := devOut.String()
		if m := regexp.MustCompile(`(?m)^  kafka +(\S+),`).FindStringSubmatch(out); m != nil {
			brokers = m[1]
		}
		if m := regexp.MustCompile(`(?m)^  registry +(\S+)`).FindStringSubmatch(out); m != nil {
			registryURL = m[1]
		}
		if brokers == "" || registryURL == "" {
			t.Fatalf("dev's banner names no broker or registry address:\n%s", out)
		}
		for _, want := range []string{"identity   " + DevIdentity, fmt.Sprintf("schema %q", db.Schema), "projector produce", "account.avsc' --key-field account_id", "projector status", "psql"} {
			if !strings.Contains(out, want) {
				t.Errorf("dev's banner does not say %q:\n%s", want, out)
			}
		}
	}

	sc := bufio.NewScanner(strings.NewReader(blocks["shell"]))
	ran := map[string]bool{}
	for sc.Scan() {
		words, stdin := docWords(sc.Text())
		if len(words) == 0 {
			continue
		}
		if len(words) < 2 {
			t.Fatalf("the journey test does not know the README's command %q: teach it", sc.Text())
		}
		switch {
		case words[0] == "projector" && words[1] == "dev":
			args := withFlags(inDir(words[1:]), map[string]string{
				"brokers-addr": "127.0.0.1:0", "registry-addr": "127.0.0.1:0", "http-addr": "",
				"database-url": db.URL, "log-format": "text",
			})
			started = true
			go func() { devDone <- Main(ctx, args, &devOut, &devErr) }()
			devRunning()
		case words[0] == "projector" && words[1] == "produce":
			args := withFlags(inDir(words[1:]), map[string]string{"brokers": brokers, "registry-url": registryURL})
			f, err := os.Open(filepath.Join(dir, stdin))
			if err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
			journeyProduce(t, ctx, args, f)
			f.Close()
		case words[0] == "projector" && words[1] == "check":
			var out syncBuffer
			args := withFlags(inDir(words[1:]), map[string]string{"registry-url": registryURL, "database-url": db.URL})
			if err := Main(ctx, args, &out, &out); err != nil {
				t.Fatalf("projector %s: %v\n%s", strings.Join(args, " "), err, out.String())
			}
			if !strings.Contains(out.String(), "ok: accounts") {
				t.Errorf("check: want the README's file to pass, got\n%s", out.String())
			}
		case words[0] == "psql":
			i := slices.Index(words, "-c")
			if i < 0 {
				t.Fatalf("README's psql line has no -c: %s", sc.Text())
			}
			want := psqlRows(blocks["psql-output"])
			testenv.WaitFor(t, 30*time.Second, func() error {
				got, err := queryRows(ctx, db, words[i+1])
				if err != nil {
					return err
				}
				if !slices.EqualFunc(got, want, slices.Equal) {
					return fmt.Errorf("%s: got %q, the README shows %q", words[i+1], got, want)
				}
				return nil
			})
		case words[0] == "projector" && words[1] == "status":
			var out syncBuffer
			args := withFlags(words[1:], map[string]string{"brokers": brokers, "database-url": db.URL})
			if err := Main(ctx, args, &out, &out); err != nil {
				t.Fatalf("projector %s: %v\n%s", strings.Join(args, " "), err, out.String())
			}
			// Every partition of the topic is applied to its end: lag 0.
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != 1+DefaultDevPartitions || !strings.HasPrefix(lines[0], "GROUP") {
				t.Fatalf("status: want a header and %d partitions, got\n%s", DefaultDevPartitions, out.String())
			}
			for _, l := range lines[1:] {
				f := strings.Fields(l)
				if f[1] != "accounts.events" || f[5] != "0" || f[12] != "ok" {
					t.Errorf("status: want accounts.events with lag 0 and state ok, got %q", l)
				}
			}
		case words[0] == "projector" && words[1] == "dlq":
			var out syncBuffer
			args := withFlags(words[1:], map[string]string{"database-url": db.URL})
			if err := Main(ctx, args, &out, &out); err != nil {
				t.Fatalf("projector %s: %v\n%s", strings.Join(args, " "), err, out.String())
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], "ID") {
				t.Errorf("dlq list: the README's events are all good, want no dead letters, got\n%s", out.String())
			}
		default:
			t.Fatalf("the journey test does not know the README's command %q: teach it", sc.Text())
		}
		ran[words[0]+" "+words[1]] = true
	}
	t.Logf("projector dev printed:\n%s", devOut.String())
	for _, step := range []string{"projector dev", "projector produce", "projector check", "projector status", "projector dlq"} {
		if !ran[step] {
			t.Errorf("the README's five-minute path has no %s step", step)
		}
	}
}

// journeyProduce runs projector produce with args (the README's, with
// the test's addresses) on stdin.
func journeyProduce(t *testing.T, ctx context.Context, args []string, stdin io.Reader) {
	t.Helper()
	var out bytes.Buffer
	if err := redact.Error(produceCommand(stdin, &out, &out).ParseAndRun(ctx, args[1:])); err != nil {
		t.Fatalf("projector %s: %v\n%s", strings.Join(args, " "), err, &out)
	}
}

// psqlRows parses psql's aligned output: the rows under the header's rule.
func psqlRows(out string) [][]string {
	var rows [][]string
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for _, l := range lines[2:] {
		var row []string
		for _, c := range strings.Split(l, "|") {
			row = append(row, strings.TrimSpace(c))
		}
		rows = append(rows, row)
	}
	return rows
}

// queryRows runs q and returns its rows as psql prints their values.
func queryRows(ctx context.Context, db *testenv.DB, q string) ([][]string, error) {
	rows, err := db.Pool.Query(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out [][]string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		var row []string
		for _, v := range vals {
			row = append(row, fmt.Sprint(v))
		}
		out = append(out, row)
	}
	return out, rows.Err()
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, os.ErrNotExist)
}
