package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
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
	if out := d.stdout.String(); !strings.Contains(out, `topics "accounts.events" (2 partitions each)`) {
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

// startDev runs projector dev on config and db, on free ports, with the
// extra flags (which win over the test's), and waits until it has printed
// its addresses.
func startDev(t *testing.T, config string, db *testenv.DB, extra ...string) *devProcess {
	t.Helper()
	return startDevArgs(t, append([]string{"dev", "--config", config, "--database-url", db.URL, "--brokers-addr", "127.0.0.1:0",
		"--registry-addr", "127.0.0.1:0", "--http-addr", "", "--log-format", "text", "--partitions", "2"}, extra...))
}

// startDevArgs runs projector dev with args, and waits until it has
// printed its addresses.
func startDevArgs(t *testing.T, args []string) *devProcess {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	d := &devProcess{t: t, done: make(chan error, 1), cancel: cancel}
	go func() {
		d.done <- Main(ctx, args, &d.stdout, &d.stderr)
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
			if f := strings.Fields(l); f[5] != "0" || f[12] != "ok" {
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

// devConfigWithSchema writes dev's projection file with its reader schema
// in the file, so that dev starts the engine without waiting for a
// producer to register one, and returns the file and the schema's.
func devConfigWithSchema(t *testing.T) (config, schemaFile string) {
	t.Helper()
	dir := t.TempDir()
	config = filepath.Join(dir, "projections.yaml")
	schemaFile = filepath.Join(dir, "account.avsc")
	text := strings.Replace(devProjections, "    table: accounts\n", "    table: accounts\n    schema: account.avsc\n", 1)
	if err := os.WriteFile(config, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(schemaFile, []byte(devSchema), 0o600); err != nil {
		t.Fatal(err)
	}
	return config, schemaFile
}

// waitRunning waits until dev says it runs, and returns its stdout.
func (d *devProcess) waitRunning() string {
	d.t.Helper()
	testenv.WaitFor(d.t, 30*time.Second, func() error {
		select {
		case err := <-d.done:
			d.stopped = true
			d.t.Fatalf("projector dev ended: %v\nstdout:\n%s\nstderr:\n%s", err, d.stdout.String(), d.stderr.String())
		default:
		}
		if !strings.Contains(d.stdout.String(), "running; next") {
			return fmt.Errorf("dev has not said it runs:\nstdout:\n%s\nstderr:\n%s", d.stdout.String(), d.stderr.String())
		}
		return nil
	})
	return d.stdout.String()
}

// TestDevServesHTTPOnLoopbackByDefault: dev, which runs on a developer's
// machine, serves /metrics, /livez and /readyz on loopback unless told
// otherwise, and says so in its banner and its help; an explicit
// --http-addr :PORT still listens on every interface, and says that too.
// run keeps its production default, every interface.
func TestDevServesHTTPOnLoopbackByDefault(t *testing.T) {
	flagOf := func(cmd, name string) *flag.Flag {
		for _, c := range rootCommand(io.Discard, io.Discard).Subcommands {
			if c.Name == cmd {
				return c.FlagSet.Lookup(name)
			}
		}
		t.Fatalf("no command %s", cmd)
		return nil
	}
	devDefault := flagOf("dev", "http-addr")
	addr, err := net.ResolveTCPAddr("tcp", devDefault.DefValue)
	if err != nil || !addr.IP.IsLoopback() {
		t.Errorf("dev's --http-addr default %q resolves to %v (%v), want a loopback address", devDefault.DefValue, addr, err)
	}
	if !strings.Contains(devDefault.Usage, "loopback only; --http-addr :8080 to listen on all interfaces") {
		t.Errorf("dev's --http-addr help does not say it is loopback only and how to listen on all interfaces: %q", devDefault.Usage)
	}
	if run := flagOf("run", "http-addr").DefValue; run != ":8080" {
		t.Errorf("run's --http-addr default is %q, want :8080 (every interface, for the deployment's scraper)", run)
	}

	config, _ := devConfigWithSchema(t)
	db := testenv.NewDB(t)
	// Without --http-addr, when the default port is free here: the
	// listener's resolved address is loopback, and another interface of
	// this machine does not answer on it.
	if free, err := net.Listen("tcp", devDefault.DefValue); err != nil {
		t.Logf("%s is in use here, so dev cannot be started on its default address: %v", devDefault.DefValue, err)
	} else {
		free.Close()
		d := startDevArgs(t, []string{"dev", "--config", config, "--database-url", db.URL, "--brokers-addr", "127.0.0.1:0",
			"--registry-addr", "127.0.0.1:0", "--log-format", "text", "--partitions", "1"})
		out := d.waitRunning()
		want := "  http       127.0.0.1:8080: /metrics, /livez, /readyz (loopback only; --http-addr :8080 to listen on all interfaces)"
		if !strings.Contains(out, want) {
			t.Errorf("dev's banner does not say %q:\n%s", want, out)
		}
		if !strings.Contains(d.stderr.String(), "serving metrics and health") || !strings.Contains(d.stderr.String(), "addr=127.0.0.1:8080") {
			t.Errorf("dev did not log that it serves on 127.0.0.1:8080:\n%s", d.stderr.String())
		}
		livez(t, "127.0.0.1:8080", true)
		if ip := otherInterface(); ip != nil {
			livez(t, net.JoinHostPort(ip.String(), "8080"), false)
		}
		d.stop()
	}

	// Told otherwise: every interface, said as such.
	d := startDev(t, config, db, "--http-addr", ":0")
	out := d.waitRunning()
	m := regexp.MustCompile(`(?m)^  http +\[::\]:(\d+): /metrics, /livez, /readyz \(all interfaces: reachable from other machines\)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("dev given --http-addr :0 does not say it serves on all interfaces:\n%s", out)
	}
	livez(t, net.JoinHostPort("127.0.0.1", m[1]), true)
	if ip := otherInterface(); ip != nil {
		livez(t, net.JoinHostPort(ip.String(), m[1]), true)
	}
	d.stop()
}

// livez checks that /livez answers at addr, or that nothing listens there.
func livez(t *testing.T, addr string, answers bool) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/livez")
	if err == nil {
		resp.Body.Close()
	}
	switch {
	case answers && err != nil:
		t.Errorf("GET http://%s/livez: %v, want an answer", addr, err)
	case !answers && err == nil:
		t.Errorf("GET http://%s/livez answered %s, want nothing listening there", addr, resp.Status)
	}
}

// otherInterface is an IPv4 address of this machine that is not loopback,
// or nil when it has none.
func otherInterface() net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP
		}
	}
	return nil
}

// TestDevQuotesTopicNames: dev's banner quotes every topic name, so that a
// name with a space, a comma or a slash reads as one name, and the produce
// command it suggests is one shell word per argument.
func TestDevQuotesTopicNames(t *testing.T) {
	if got, want := quoteTopics([]string{"accounts.events", "bad topic/../x", "a, b"}), `"accounts.events", "bad topic/../x", "a, b"`; got != want {
		t.Errorf("quoteTopics: got %s, want %s", got, want)
	}
	f := &devFlags{}
	f.config, f.identity, f.databaseURL = "projections.yaml", DevIdentity, DefaultDatabaseURL
	var out bytes.Buffer
	f.banner(&out, dbTarget{}, nil, DevBrokers, DevRegistryURL, []*projection.Projection{
		{Name: "odd", Topic: "bad topic/../x", Table: "odd", KeyField: "id"},
		{Name: "plain", Topic: "accounts.events", Table: "accounts", KeyField: "account_id"},
	})
	for _, want := range []string{
		"projector produce --topic 'bad topic/../x' --schema SCHEMA.avsc --key-field id",
		"projector produce --topic accounts.events --schema SCHEMA.avsc --key-field account_id",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dev's banner does not say %q:\n%s", want, out.String())
		}
	}
}

// TestDevRefusesAnIdentityItDidNotCreate: offsets stored under an identity
// by the engine, as projector run stores them, are not dev's to move back
// to 0: dev --identity naming it stops before it joins anything, saying
// which identity and which flag forces it, and the offsets stay as they
// were. --take-over-identity forces it. An identity dev created itself it
// starts on again, and again.
func TestDevRefusesAnIdentityItDidNotCreate(t *testing.T) {
	config, _ := devConfigWithSchema(t)
	db := testenv.NewDB(t)
	ctx := t.Context()
	if err := postgres.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	// The engine's own calls, as a run member assigned the partitions
	// makes them.
	runs := postgres.NewOffsets(db.Pool, "orders-view")
	claims, err := runs.Claim(ctx, []sinks.TP{{Topic: "accounts.events", Partition: 0}, {Topic: "accounts.events", Partition: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range claims {
		if err := runs.Init(ctx, c, int64(40+i)); err != nil {
			t.Fatal(err)
		}
	}
	stored := func(identity string) string {
		t.Helper()
		list, err := postgres.NewOffsets(db.Pool, identity).List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, s := range list {
			next := "none"
			if s.NextOffset != nil {
				next = fmt.Sprint(*s.NextOffset)
			}
			fmt.Fprintf(&b, "%s/%d next %s epoch %d; ", s.Topic, s.Partition, next, s.Epoch)
		}
		return b.String()
	}
	before := stored("orders-view")

	args := []string{"dev", "--config", config, "--database-url", db.URL, "--brokers-addr", "127.0.0.1:0",
		"--registry-addr", "127.0.0.1:0", "--http-addr", "", "--log-format", "text", "--partitions", "2", "--identity", "orders-view"}
	var out syncBuffer
	err = Main(ctx, args, &out, &out)
	if !errors.Is(err, ErrNotDevIdentity) || !strings.Contains(err.Error(), `--identity "orders-view"`) || !strings.Contains(err.Error(), "--take-over-identity") {
		t.Fatalf("dev --identity orders-view: got %v, want a refusal naming the identity and --take-over-identity\n%s", err, out.String())
	}
	if exitCode(err) != exitFailed {
		t.Errorf("dev refusing the identity exits %d, want %d", exitCode(err), exitFailed)
	}
	if after := stored("orders-view"); after != before {
		t.Errorf("the refused dev moved the identity's offsets: %s, were %s", after, before)
	}

	// The flag comes from the command line only: a variable left in a
	// shell takes nothing over.
	t.Run("env", func(t *testing.T) {
		t.Setenv("PROJECTOR_TAKE_OVER_IDENTITY", "true")
		var out syncBuffer
		if err := Main(ctx, args, &out, &out); !errors.Is(err, ErrNotDevIdentity) {
			t.Errorf("dev with PROJECTOR_TAKE_OVER_IDENTITY set: got %v, want the refusal\n%s", err, out.String())
		}
		if after := stored("orders-view"); after != before {
			t.Errorf("dev moved the identity's offsets on an environment variable: %s, were %s", after, before)
		}
	})

	d := startDevArgs(t, append(slices.Clone(args), "--take-over-identity"))
	if out := d.waitRunning(); !strings.Contains(out, `identity "orders-view" was not created by projector dev; taken over`) {
		t.Errorf("dev --take-over-identity did not say it took the identity over:\n%s", out)
	}
	d.stop()
	if after := stored("orders-view"); !strings.Contains(after, "accounts.events/0 next 0 epoch") || !strings.Contains(after, "accounts.events/1 next 0 epoch") {
		t.Errorf("dev --take-over-identity left the offsets at %s, want them at 0", after)
	}
	// Taking over is asked again on every start.
	out = syncBuffer{}
	if err := Main(ctx, args, &out, &out); !errors.Is(err, ErrNotDevIdentity) {
		t.Errorf("dev --identity orders-view after a take-over: got %v, want the refusal again", err)
	}

	// An identity dev created: started twice, with offsets stored in
	// between, without a flag.
	for i := range 2 {
		d := startDev(t, config, db, "--identity", "mine")
		d.waitRunning()
		testenv.WaitFor(t, 30*time.Second, func() error {
			if s := stored("mine"); !strings.Contains(s, "accounts.events/1") {
				return fmt.Errorf("start %d: dev has not stored both partitions' offsets: %s", i+1, s)
			}
			return nil
		})
		d.stop()
	}
}
