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
	eventsFile := filepath.Join(dir, "events.jsonl")
	for name, text := range map[string]string{
		config:     devProjections,
		schemaFile: devSchema,
		eventsFile: `{"account_id": "a-1", "version": 1, "type": "Deposited", "amount": 5}
{"account_id": "a-1", "version": 2, "type": "Deposited", "amount": 7}
`,
	} {
		if err := os.WriteFile(name, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	db := testenv.NewDB(t)
	d := startDev(t, config, db)
	const waiting = "waiting for a schema under subject accounts.events-value: register one with projector produce --topic accounts.events --schema FILE.avsc --key-field account_id < events.jsonl"
	testenv.WaitFor(t, 20*time.Second, func() error {
		if !strings.Contains(d.stderr.String(), waiting) {
			return fmt.Errorf("dev has not logged %q:\nstdout:\n%s\nstderr:\n%s", waiting, d.stdout.String(), d.stderr.String())
		}
		return nil
	})
	if out := d.stdout.String(); !strings.Contains(out, "topics accounts.events (2 partitions each)") {
		t.Errorf("dev's banner does not name the topic it created with --partitions 2:\n%s", out)
	}
	events, err := os.ReadFile(eventsFile)
	if err != nil {
		t.Fatal(err)
	}
	d.produce(schemaFile, string(events))
	waitBalance(t, db, 12, 2)
	d.stop()
	if n := strings.Count(d.stderr.String(), "waiting for a schema"); n != 1 {
		t.Errorf("dev said %d times that it waits for the schema, want once:\n%s", n, d.stderr.String())
	}
	if !strings.Contains(d.stdout.String(), "running; next") {
		t.Errorf("dev did not say it runs once the schema came:\n%s", d.stdout.String())
	}
}

// devProcess is a projector dev running in the test's process.
type devProcess struct {
	t               *testing.T
	stdout, stderr  syncBuffer
	done            chan error
	cancel          context.CancelFunc
	stopped         bool
	brokers, regURL string
}

// startDev runs projector dev on config and db, on free ports, and waits
// until it has printed its addresses.
func startDev(t *testing.T, config string, db *testenv.DB) *devProcess {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	d := &devProcess{t: t, done: make(chan error, 1), cancel: cancel}
	go func() {
		d.done <- Main(ctx, []string{"dev", "--config", config, "--database-url", db.URL, "--brokers-addr", "127.0.0.1:0",
			"--registry-addr", "127.0.0.1:0", "--http-addr", "", "--log-format", "text", "--partitions", "2"}, &d.stdout, &d.stderr)
	}()
	t.Cleanup(d.stop)
	testenv.WaitFor(t, 20*time.Second, func() error {
		out := d.stdout.String()
		brokers := regexp.MustCompile(`(?m)^  kafka +(\S+),`).FindStringSubmatch(out)
		registry := regexp.MustCompile(`(?m)^  registry +(\S+)`).FindStringSubmatch(out)
		if brokers == nil || registry == nil {
			return fmt.Errorf("dev has printed no addresses:\nstdout:\n%s\nstderr:\n%s", out, d.stderr.String())
		}
		d.brokers, d.regURL = brokers[1], registry[1]
		return nil
	})
	return d
}

// stop cancels dev, as Ctrl-C does, and checks that it ended cleanly.
func (d *devProcess) stop() {
	if d.stopped {
		return
	}
	d.stopped = true
	d.cancel()
	if err := <-d.done; err != nil {
		d.t.Errorf("dev did not stop cleanly: %v\n%s", err, d.stderr.String())
	}
}

// produce sends the JSON lines as projector produce would.
func (d *devProcess) produce(schemaFile, lines string) {
	d.t.Helper()
	journeyProduce(d.t, d.t.Context(), []string{"produce", "--topic", "accounts.events", "--schema", schemaFile, "--key-field", "account_id",
		"--brokers", d.brokers, "--registry-url", d.regURL}, strings.NewReader(lines))
}

// waitBalance waits until account a-1 has the balance at the version.
func waitBalance(t *testing.T, db *testenv.DB, balance, version int64) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, func() error {
		var b, v int64
		err := db.Pool.QueryRow(t.Context(), `SELECT balance, version FROM accounts WHERE account_id = 'a-1'`).Scan(&b, &v)
		if err != nil || b != balance || v != version {
			return fmt.Errorf("a-1: balance %d version %d (%v), want %d at version %d", b, v, err, balance, version)
		}
		return nil
	})
}

// TestDevRestartsOnItsOwnTables stops dev and starts it again on the same
// database: the embedded broker's topics start empty again, and the
// offsets the first start stored (past the new, empty log's end) must not
// halt the partitions. The rows stay; the same events produced again are
// stale; the next version applies.
func TestDevRestartsOnItsOwnTables(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "projections.yaml")
	schemaFile := filepath.Join(dir, "account.avsc")
	if err := os.WriteFile(config, []byte(devProjections), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(schemaFile, []byte(devSchema), 0o600); err != nil {
		t.Fatal(err)
	}
	const first = `{"account_id": "a-1", "version": 1, "type": "Deposited", "amount": 5}
{"account_id": "a-1", "version": 2, "type": "Deposited", "amount": 7}
{"account_id": "a-2", "version": 1, "type": "Deposited", "amount": 1}
{"account_id": "a-3", "version": 1, "type": "Deposited", "amount": 1}
`
	db := testenv.NewDB(t)
	d := startDev(t, config, db)
	d.produce(schemaFile, first)
	waitBalance(t, db, 12, 2)
	d.stop()
	// A projector run's offsets in the same database are not dev's to move.
	if _, err := db.Pool.Exec(t.Context(), `INSERT INTO projector_offsets (identity, topic, partition, next_offset, owner_epoch)
		VALUES ('projector', 'accounts.events', 0, 500, 3)`); err != nil {
		t.Fatal(err)
	}

	d = startDev(t, config, db)
	d.produce(schemaFile, first+`{"account_id": "a-1", "version": 3, "type": "Deposited", "amount": 100}
`)
	waitBalance(t, db, 112, 3)
	if out := d.stdout.String(); !strings.Contains(out, "stored offsets of identity projector-dev moved back to 0") {
		t.Errorf("the second dev did not say it moved the stored offsets back:\n%s", out)
	}
	var out syncBuffer
	testenv.WaitFor(t, 30*time.Second, func() error {
		out = syncBuffer{}
		if err := Main(t.Context(), []string{"status", "--brokers", d.brokers, "--database-url", db.URL, "--identity", DevIdentity}, &out, &out); err != nil {
			return err
		}
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n")[1:] {
			if f := strings.Fields(l); f[5] != "0" || f[7] != "ok" {
				return fmt.Errorf("status: want lag 0 and state ok on every partition:\n%s", out.String())
			}
		}
		return nil
	})
	d.stop()
	var next, epoch int64
	if err := db.Pool.QueryRow(t.Context(), `SELECT next_offset, owner_epoch FROM projector_offsets WHERE identity = 'projector'`).Scan(&next, &epoch); err != nil || next != 500 || epoch != 3 {
		t.Errorf("run's stored offset after two dev starts: %d at epoch %d (%v), want 500 at epoch 3, untouched", next, epoch, err)
	}
	if strings.Contains(d.stderr.String(), "halted") {
		t.Errorf("a partition halted after the restart:\n%s", d.stderr.String())
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
