package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/testenv"
)

const devProjections = `projections:
  - name: accounts
    topic: accounts.events
    table: accounts
    key: account_id
    mode: fold
    type_field: type
    columns:
      account_id: {type: text, primary_key: true}
      balance:    {type: bigint, default: 0}
    events:
      Deposited: {add: {balance: amount}}
`

const devSchema = `{"type": "record", "name": "AccountEvent", "fields": [
  {"name": "account_id", "type": "string"}, {"name": "version", "type": "long"},
  {"name": "type", "type": "string"}, {"name": "amount", "type": "long", "default": 0}]}`

// TestDevWaitsForTheRegistrysSchema starts dev on a projection whose reader
// schema is to come from the registry, which dev starts empty: dev does not
// refuse to start, it says once what it waits for and how to register it,
// and applies events as soon as a producer registers the schema.
func TestDevWaitsForTheRegistrysSchema(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "projections.yaml")
	schemaFile := filepath.Join(dir, "account.avsc")
	events := filepath.Join(dir, "events.jsonl")
	for name, text := range map[string]string{
		config:     devProjections,
		schemaFile: devSchema,
		events: `{"account_id": "a-1", "version": 1, "type": "Deposited", "amount": 5}
{"account_id": "a-1", "version": 2, "type": "Deposited", "amount": 7}
`,
	} {
		if err := os.WriteFile(name, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	db := testenv.NewDB(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- Main(ctx, []string{"dev", "--config", config, "--database-url", db.URL, "--brokers-addr", "127.0.0.1:0",
			"--registry-addr", "127.0.0.1:0", "--http-addr", "", "--log-format", "text", "--partitions", "2"}, &stdout, &stderr)
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("dev did not stop cleanly: %v\n%s", err, stderr.String())
			}
		}
	}
	defer stop()

	const waiting = "waiting for a schema under subject accounts.events-value: register one with projector produce --topic accounts.events --schema FILE.avsc"
	testenv.WaitFor(t, 20*time.Second, func() error {
		if !strings.Contains(stderr.String(), waiting) {
			return fmt.Errorf("dev has not logged %q:\nstdout:\n%s\nstderr:\n%s", waiting, stdout.String(), stderr.String())
		}
		return nil
	})
	out := stdout.String()
	brokers := regexp.MustCompile(`(?m)^  kafka +(\S+),`).FindStringSubmatch(out)
	registry := regexp.MustCompile(`(?m)^  registry +(\S+)`).FindStringSubmatch(out)
	if brokers == nil || registry == nil {
		t.Fatalf("dev printed no addresses while it waits:\n%s", out)
	}
	if !strings.Contains(out, "topics accounts.events (2 partitions each)") {
		t.Errorf("dev's banner does not name the topic it created with --partitions 2:\n%s", out)
	}

	f, err := os.Open(events)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	journeyProduce(t, ctx, []string{"produce", "--topic", "accounts.events", "--schema", schemaFile, "--key-field", "account_id",
		"--brokers", brokers[1], "--registry-url", registry[1]}, f)
	testenv.WaitFor(t, 30*time.Second, func() error {
		var balance, version int64
		err := db.Pool.QueryRow(ctx, `SELECT balance, version FROM accounts WHERE account_id = 'a-1'`).Scan(&balance, &version)
		if err != nil || balance != 12 || version != 2 {
			return fmt.Errorf("a-1: balance %d version %d (%v), want 12 at version 2", balance, version, err)
		}
		return nil
	})
	stop()
	if n := strings.Count(stderr.String(), "waiting for a schema"); n != 1 {
		t.Errorf("dev said %d times that it waits for the schema, want once:\n%s", n, stderr.String())
	}
	if !strings.Contains(stdout.String(), "running; next") {
		t.Errorf("dev did not say it runs once the schema came:\n%s", stdout.String())
	}
}

// TestDevRefusesBadFlags: each mistake is named before anything starts.
func TestDevRefusesBadFlags(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "projections.yaml")
	if err := os.WriteFile(config, []byte(devProjections), 0o600); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	base := []string{"dev", "--config", config, "--http-addr", "", "--database-url", testenv.DatabaseURL()}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--partitions", "0", "--brokers-addr", "127.0.0.1:0", "--registry-addr", "127.0.0.1:0"}, "--partitions 0: must be at least 1"},
		{[]string{"--brokers-addr", busy.Addr().String(), "--registry-addr", "127.0.0.1:0"}, "--brokers-addr: start the embedded broker on " + busy.Addr().String()},
		{[]string{"--brokers-addr", "127.0.0.1:0", "--registry-addr", busy.Addr().String()}, "--registry-addr: start the embedded registry on " + busy.Addr().String()},
		{[]string{"--brokers-addr", "localhost", "--registry-addr", "127.0.0.1:0"}, `--brokers-addr: broker address "localhost": want host:port`},
		{[]string{"--brokers-addr", "127.0.0.1:0", "--registry-addr", "127.0.0.1:0", "extra"}, `unexpected argument "extra"`},
	} {
		var out syncBuffer
		args := append(append([]string{}, base...), tc.args...)
		err := Main(t.Context(), args, &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("projector %s: got %v, want an error saying %q", strings.Join(args, " "), err, tc.want)
		}
	}
}
