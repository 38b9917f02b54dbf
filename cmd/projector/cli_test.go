package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/internal/cliflag"
	"github.com/projector-dev/projector/internal/demo"
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
	err = Main(ctx, []string{"demo", "--database-url", testenv.DatabaseURL(), "--schema", schema, "--aggregates", "2000"}, &out, &errs)
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

	u, _ := url.Parse(testenv.DatabaseURL())
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	out.Reset()
	if err := Main(ctx, []string{"dlq", "list", "--json", "--database-url", u.String()}, &out, &errs); err != nil {
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
		{[]string{"run", "--brokers", "b", "--registry-url", "r", "--start-from", "middle"}, "--start-from"},
		{[]string{"run", "--brokers", "b", "--registry-url", "r", "--batch-max-records", "0"}, "--batch-max-records"},
		{[]string{"run", "--brokers", "b", "--registry-url", "r", "--commit-max-batches", "0"}, "--commit-max-batches"},
		{[]string{"run", "--brokers", "b", "--registry-url", "r", "--member-max-records", "-1"}, "--member-max-records"},
		{[]string{"run", "--brokers", "b", "--registry-url", "r", "--state-cache-bytes", "lots"}, "-state-cache-bytes"},
		{[]string{"run", "--brokers", "b", "--registry-url", "r", "--state-cache-bytes", "-5MiB"}, "-state-cache-bytes"},
		{[]string{"run", "--brokers", "b", "--registry-url", "r", "--dead-letter-storm-share", "1.5"}, "-dead-letter-storm-share"},
		{[]string{"run", "--brokers", "b", "--registry-url", "r", "--dead-letter-storm-share", "half"}, "-dead-letter-storm-share"},
		{[]string{"run", "--brokers", "b", "--registry-url", "r", "--dead-letter-storm-window", "0"}, "--dead-letter-storm-window"},
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

// Shares are fractions of 1, and off (or 0) turns the guard off, which
// the engine reads as a negative share (its 0 is the default).
func TestShareFlag(t *testing.T) {
	for in, want := range map[string]float64{"0.5": 0.5, "1": 1, "0.05": 0.05, "off": -1, "OFF": -1, "0": -1} {
		var s cliflag.Share
		if err := s.Set(in); err != nil || cliflag.ShareOff(s) != want {
			t.Errorf("%q: got %v, %v; want %v", in, cliflag.ShareOff(s), err, want)
		}
	}
	for _, in := range []string{"-0.1", "1.01", "NaN", "half", ""} {
		var s cliflag.Share
		if err := s.Set(in); err == nil {
			t.Errorf("%q: accepted as %v", in, s)
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
