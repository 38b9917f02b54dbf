package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/schemas"
)

// produceEnv is a Kafka cluster with one topic and a registry.
type produceEnv struct {
	t       *testing.T
	topic   string
	kafka   *kfake.Cluster
	regURL  string
	reg     *sr.Client
	brokers string
}

func newProduceEnv(t *testing.T, topic string, partitions int) *produceEnv {
	t.Helper()
	e := &produceEnv{t: t, topic: topic, kafka: testenv.Kafka(t, topic, partitions)}
	e.brokers = strings.Join(e.kafka.ListenAddrs(), ",")
	fake, reg := testenv.Registry(t)
	e.regURL, e.reg = fake.URL(), reg
	return e
}

// produce runs projector produce against the environment with stdin, and
// returns what it printed.
func (e *produceEnv) produce(stdin io.Reader, args ...string) (string, error) {
	var out bytes.Buffer
	args = append([]string{"--brokers", e.brokers, "--registry-url", e.regURL, "--topic", e.topic, "--timeout", "20s"}, args...)
	err := redact.Error(produceCommand(stdin, &out, &out).ParseAndRun(e.t.Context(), args))
	return out.String(), err
}

// records consumes the topic from the start until it has n records.
func (e *produceEnv) records(n int) []*kgo.Record {
	e.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.ListenAddrs()...), kgo.ConsumeTopics(e.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	var got []*kgo.Record
	testenv.WaitFor(e.t, 20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(e.t.Context(), 200*time.Millisecond)
		defer cancel()
		got = append(got, cl.PollFetches(ctx).Records()...)
		if len(got) < n {
			return fmt.Errorf("%d of %d records consumed", len(got), n)
		}
		return nil
	})
	if len(got) != n {
		e.t.Fatalf("consumed %d records, want %d", len(got), n)
	}
	// Sorted by key and offset: the lines' order within each key.
	slices.SortStableFunc(got, func(a, b *kgo.Record) int {
		if c := bytes.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return cmp.Compare(a.Offset, b.Offset)
	})
	return got
}

// empty fails the test unless the topic has no records.
func (e *produceEnv) empty() {
	e.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.ListenAddrs()...))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	end, err := demo.EndOffsets(e.t.Context(), kadm.NewClient(cl), e.topic)
	if err != nil {
		e.t.Fatal(err)
	}
	for p, o := range end {
		if o != 0 {
			e.t.Fatalf("partition %d has %d records, want none", p, o)
		}
	}
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const produceTestSchema = `{
  "type": "record", "name": "Order", "namespace": "shop",
  "fields": [
    {"name": "order_id", "type": "string"},
    {"name": "version", "type": "long"},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "due", "type": {"type": "int", "logicalType": "date"}},
    {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}}
  ]
}`

// TestProduceJSONLines: the same event in plain JSON and in Avro's JSON
// encoding, read from stdin, decodes back (with the registry the schema
// was registered in) to the values written, keyed by the --key-field; the
// summary names the count, topic, partitions and schema id.
func TestProduceJSONLines(t *testing.T) {
	e := newProduceEnv(t, "orders", 3)
	avsc := writeFile(t, "order.avsc", produceTestSchema)
	in := strings.NewReader(`{"order_id": "o-1", "version": 1, "status": "NEW", "note": "gift", "tags": ["a", "b"],` +
		` "placed_at": "2026-12-01T10:30:00.250Z", "due": "2026-12-24", "total": 12.5}

{"order_id": "o-2", "version": 1, "status": "NEW", "note": {"string": "gift"}, "tags": ["a", "b"],` +
		` "placed_at": 1796121000250, "due": 20811, "total": "12.50"}
{"order_id": "o-3", "version": 7, "status": "PAID", "note": null, "tags": [], "placed_at": 0, "due": 0, "total": -1}
`)
	out, err := e.produce(in, "--schema", avsc, "--key-field", "order_id")
	if err != nil {
		t.Fatalf("produce: %v\n%s", err, out)
	}
	ss, err := e.reg.SchemaByVersion(t.Context(), "orders-value", -1)
	if err != nil {
		t.Fatalf("the schema was not registered under orders-value: %v", err)
	}
	if want := "produced 3 records to orders, partitions "; !strings.HasPrefix(out, want) ||
		!strings.Contains(out, fmt.Sprintf("schema id %d (subject orders-value)", ss.ID)) {
		t.Errorf("summary %q, want one starting %q and naming schema id %d", out, want, ss.ID)
	}
	recs := e.records(3)
	dec := schemas.NewDecoder(e.reg, nil)
	var got []map[string]any
	for i, r := range recs {
		if want := fmt.Sprintf("o-%d", i+1); string(r.Key) != want {
			t.Errorf("record %d has key %q, want %q", i, r.Key, want)
		}
		v, id, err := dec.Decode(t.Context(), r.Value)
		if err != nil {
			t.Fatalf("record %d does not decode: %v", i, err)
		}
		if id != ss.ID {
			t.Errorf("record %d has schema id %d, want %d", i, id, ss.ID)
		}
		got = append(got, v)
	}
	want := map[string]any{
		"order_id": "o-1", "version": int64(1), "status": "NEW", "note": "gift", "tags": []any{"a", "b"},
		"placed_at": time.Date(2026, 12, 1, 10, 30, 0, 250e6, time.UTC), "due": time.Date(2026, 12, 24, 0, 0, 0, 0, time.UTC),
		"total": big.NewRat(25, 2),
	}
	if !sameValues(got[0], want) {
		t.Errorf("the plain JSON line decodes as\n %v\nwant\n %v", got[0], want)
	}
	want["order_id"] = "o-2"
	if !sameValues(got[1], want) {
		t.Errorf("the Avro JSON line decodes as\n %v\nwant\n %v", got[1], want)
	}
	if got[2]["note"] != nil || got[2]["status"] != "PAID" || got[2]["version"] != int64(7) {
		t.Errorf("the third line decodes as %v", got[2])
	}
}

// sameValues compares decoded records, times by instant and decimals by
// value.
func sameValues(got, want map[string]any) bool {
	if len(got) != len(want) {
		return false
	}
	for k, w := range want {
		g := got[k]
		switch w := w.(type) {
		case time.Time:
			if gt, ok := g.(time.Time); !ok || !gt.Equal(w) {
				return false
			}
		case *big.Rat:
			if gr, ok := g.(*big.Rat); !ok || gr.Cmp(w) != 0 {
				return false
			}
		default:
			if !reflect.DeepEqual(g, w) {
				return false
			}
		}
	}
	return true
}

// failingReader fails the test if anything reads it: tombstones alone
// must not wait for stdin.
type failingReader struct{ t *testing.T }

func (r failingReader) Read([]byte) (int, error) {
	r.t.Error("stdin was read")
	return 0, io.EOF
}

// TestProduceKeysTombstonesRaw: a fixed --key for every line; tombstones
// without stdin; raw, hex and base64 lines as the values' exact bytes.
func TestProduceKeysTombstonesRaw(t *testing.T) {
	e := newProduceEnv(t, "raw", 1)
	out, err := e.produce(strings.NewReader("not avro\n\n{\"a\": 1}\n"), "--format", "raw", "--key", "k1")
	if err != nil {
		t.Fatalf("raw: %v\n%s", err, out)
	}
	if want := "produced 2 records to raw, partitions 0, no schema\n"; out != want {
		t.Errorf("summary %q, want %q", out, want)
	}
	if out, err := e.produce(strings.NewReader("00 0000 0001 ff\n"), "--format", "hex", "--key", "k2"); err != nil {
		t.Fatalf("hex: %v\n%s", err, out)
	}
	if out, err := e.produce(strings.NewReader("AAAAAAL/\n"), "--format", "base64", "--key", "k3"); err != nil {
		t.Fatalf("base64: %v\n%s", err, out)
	}
	out, err = e.produce(failingReader{t}, "--tombstone", "acc-1", "--tombstone", "acc-2")
	if err != nil {
		t.Fatalf("tombstones: %v\n%s", err, out)
	}
	if !strings.HasPrefix(out, "produced 2 records (2 tombstones) to raw") {
		t.Errorf("summary %q, want it to count 2 tombstones", out)
	}
	// With --file -, stdin is read as well: its lines, then the tombstone.
	out, err = e.produce(strings.NewReader("last\n"), "--format", "raw", "--key", "k4", "--file", "-", "--tombstone", "k4")
	if err != nil || !strings.HasPrefix(out, "produced 2 records (1 tombstone) to raw") {
		t.Fatalf("stdin and a tombstone: %q, %v", out, err)
	}
	recs := e.records(8)
	want := []struct {
		key   string
		value []byte
	}{
		{"acc-1", nil}, {"acc-2", nil},
		{"k1", []byte("not avro")}, {"k1", []byte(`{"a": 1}`)},
		{"k2", []byte{0, 0, 0, 0, 1, 0xff}}, {"k3", []byte{0, 0, 0, 0, 2, 0xff}},
		{"k4", []byte("last")}, {"k4", nil},
	}
	for i, w := range want {
		r := recs[i]
		if string(r.Key) != w.key || !bytes.Equal(r.Value, w.value) || (w.value == nil) != (r.Value == nil) {
			t.Errorf("record %d: key %q value %q, want key %q value %q", i, r.Key, r.Value, w.key, w.value)
		}
	}
}

// TestProduceBadLineProducesNothing: every line is encoded before any is
// produced; a line that does not fit its schema names its number and
// field, and the topic stays empty.
func TestProduceBadLineProducesNothing(t *testing.T) {
	e := newProduceEnv(t, demo.Topic, 3)
	avsc := filepath.Join("..", "..", "internal", "demo", "account_event.avsc")
	lines := `{"account_id": "a", "version": 1, "type": "AccountOpened", "owner": "Ada", "occurred_at": "2026-12-01T00:00:00Z"}
{"account_id": "a", "version": 2, "type": "Deposited", "amount": 10, "occurred_at": "2026-12-01T00:00:01Z"}
{"account_id": "a", "version": 3, "type": "Deposited", "amount": "ten", "occurred_at": "2026-12-01T00:00:02Z"}
`
	_, err := e.produce(strings.NewReader(lines), "--schema", avsc, "--key-field", "account_id")
	if want := `line 3: field "amount": want long, got "ten" (nothing was produced)`; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
	lines += "{\"account_id\": \"a\", \"version\": 4, \"type\": \"Deposited\", \"amout\": 1, \"occurred_at\": 0}\nnot json\n"
	_, err = e.produce(strings.NewReader(lines), "--schema", avsc, "--key-field", "account_id")
	for _, want := range []string{"3 of 5 lines do not encode; nothing was produced", `line 3: field "amount"`,
		`line 4: field "amout": not a field of record demo.accounts.AccountEvent`, "line 5: not JSON"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an error saying %q", err, want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--schema", avsc}, "no record key: give --key-field F (the key is the event's field F) or --key K"},
		{[]string{"--schema", avsc, "--key", "a", "--key-field", "account_id"}, "--key-field and --key both given"},
		{[]string{"--schema", avsc, "--key-field", "acount_id"}, "--key-field acount_id: record demo.accounts.AccountEvent has no such field (it has account_id, version"},
		{[]string{"--format", "hex", "--key-field", "account_id"}, "--key-field needs --format json"},
		{[]string{"--format", "yaml", "--key", "a"}, `--format "yaml": want json, raw, hex or base64`},
		{[]string{"--key", "a", "--timeout", "0s"}, "--timeout 0s: must be positive"},
		{[]string{"--key", "a", "--subject", "nobody-value"}, `subject "nobody-value" has no schema in the registry: register one with --schema FILE.avsc`},
	} {
		_, err := e.produce(strings.NewReader(lines), tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("produce %s: got %v, want an error saying %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
	var out bytes.Buffer
	err = Main(t.Context(), []string{"produce", "--topic", "t", "--key", "a", "events.jsonl"}, &out, &out)
	if want := `unexpected argument "events.jsonl"`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a stray argument: got %v, want an error saying %q", err, want)
	}
	e.empty()
}

// TestProduceSchemaSubjects: --schema registers once (the second run
// reuses the id), --subject alone encodes with the subject's latest
// version, and --schema with --subject registers under that subject.
func TestProduceSchemaSubjects(t *testing.T) {
	ctx := t.Context()
	e := newProduceEnv(t, demo.Topic, 1)
	files, err := demo.Schemas()
	if err != nil {
		t.Fatal(err)
	}
	v1 := writeFile(t, "v1.avsc", files["account_event"])
	line := `{"account_id": "a", "version": 1, "type": "AccountOpened", "owner": "Ada", "occurred_at": 0}` + "\n"
	var ids []int
	for range 2 {
		out, err := e.produce(strings.NewReader(line), "--schema", v1, "--key-field", "account_id")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var id int
		if _, err := fmt.Sscanf(out[strings.Index(out, "schema id"):], "schema id %d", &id); err != nil {
			t.Fatalf("summary %q names no schema id", out)
		}
		ids = append(ids, id)
	}
	versions, err := e.reg.SubjectVersions(ctx, demo.Topic+"-value")
	if err != nil || len(versions) != 1 || ids[0] != ids[1] {
		t.Fatalf("registering the same schema twice: ids %v, versions %v (%v); want one version, one id", ids, versions, err)
	}
	// A newer version registered by someone else: --subject alone uses it.
	v2, err := e.reg.CreateSchema(ctx, demo.Topic+"-value", sr.Schema{Schema: files["account_event_v2"]})
	if err != nil {
		t.Fatal(err)
	}
	out, err := e.produce(strings.NewReader(strings.Replace(line, `"version": 1`, `"version": 2, "currency": "EUR"`, 1)),
		"--subject", demo.Topic+"-value", "--key", "a")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if want := fmt.Sprintf("schema id %d (subject %s-value)", v2.ID, demo.Topic); !strings.Contains(out, want) {
		t.Errorf("summary %q, want it to name %q", out, want)
	}
	// Neither flag: the topic's value subject, latest version.
	if out, err = e.produce(strings.NewReader(line), "--key", "a"); err != nil || !strings.Contains(out, fmt.Sprintf("schema id %d", v2.ID)) {
		t.Errorf("without --schema or --subject: %q, %v; want the latest of %s-value", out, err, demo.Topic)
	}
	// --schema under another subject.
	if out, err = e.produce(strings.NewReader(line), "--schema", v1, "--subject", "other", "--key", "a"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := e.reg.SchemaByVersion(ctx, "other", -1); err != nil {
		t.Errorf("--schema with --subject other did not register under other: %v", err)
	}
	recs := e.records(5)
	dec := schemas.NewDecoder(e.reg, nil)
	v, _, err := dec.Decode(ctx, recs[2].Value)
	if err != nil || v["currency"] != "EUR" {
		t.Errorf("the record encoded with the latest version decodes as %v (%v), want currency EUR", v, err)
	}
}

// TestProduceDefaultsToDev: without flags, produce talks to projector
// dev's broker and registry.
func TestProduceDefaultsToDev(t *testing.T) {
	fs := produceCommand(nil, io.Discard, io.Discard).FlagSet
	for name, want := range map[string]string{"brokers": DevBrokers, "registry-url": DevRegistryURL} {
		if fl := fs.Lookup(name); fl == nil || fl.DefValue != want || fl.Value.String() != want {
			t.Errorf("--%s defaults to %v, want %s", name, fl, want)
		}
	}
}

// TestProduceDemoEndToEnd produces the demo's account events as plain JSON
// lines (duplicates, reordered and missing versions, closed accounts),
// then tombstones and poison pills, with projector produce, runs the
// example projection over them with projector run, and compares the
// table with the reference fold of what was produced.
func TestProduceDemoEndToEnd(t *testing.T) {
	ctx := t.Context()
	e := newProduceEnv(t, demo.Topic, 3)
	db := testenv.NewDB(t)
	stream := demo.Generate(demo.Options{Aggregates: 300, MeanEvents: 6, Duplicate: 0.05, Reorder: 0.05,
		GapEvery: 50, CloseEvery: 10, Seed: 28})
	sent, lines := jsonLines(t, stream)
	avsc := filepath.Join("..", "..", "internal", "demo", "account_event.avsc")
	path := writeFile(t, "events.jsonl", lines)
	var out bytes.Buffer
	common := []string{"--brokers", e.brokers, "--registry-url", e.regURL, "--topic", demo.Topic}
	if err := Main(ctx, append([]string{"produce", "--schema", avsc, "--key-field", "account_id", "--file", path}, common...), &out, &out); err != nil {
		t.Fatalf("produce: %v\n%s", err, &out)
	}
	tombstoned := []string{"acc-000003", "acc-000007", "acc-999999"}
	args := []string{"produce"}
	for _, k := range tombstoned {
		args = append(args, "--tombstone", k)
		sent = append(sent, demo.Record{Key: k, Tombstone: true})
	}
	if err := Main(ctx, append(args, common...), &out, &out); err != nil {
		t.Fatalf("produce tombstones: %v\n%s", err, &out)
	}
	poison := writeFile(t, "poison.hex", "00 00 00 00 01 ff ff\n0102\n")
	if err := Main(ctx, append([]string{"produce", "--format", "hex", "--key", "acc-000001", "--file", poison}, common...), &out, &out); err != nil {
		t.Fatalf("produce poison: %v\n%s", err, &out)
	}
	sent = append(sent, demo.Record{Key: "acc-000001", Poison: "bad bytes"}, demo.Record{Key: "acc-000001", Poison: "bad bytes"})

	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	end, err := demo.EndOffsets(ctx, kadm.NewClient(cl), demo.Topic)
	if err != nil {
		t.Fatal(err)
	}
	if total := sumOffsets(end); total != int64(len(sent)) {
		t.Fatalf("the topic has %d records, want the %d produced", total, len(sent))
	}

	runCtx, stop := context.WithCancel(ctx)
	var runOut bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- Main(runCtx, []string{"run", "--brokers", e.brokers, "--registry-url", e.regURL,
			"--database-url", db.URL, "--identity", "produced", "--http-addr", "", "--log-level", "warn",
			"--config", filepath.Join("..", "..", "examples", "projections.yaml")}, &runOut, &runOut)
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v\n%s", err, runOut.String())
		}
	}()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, db.Pool, "produced", demo.Topic, end, nil); err != nil {
		t.Fatalf("%v\n%s", err, runOut.String())
	}
	exp := demo.Fold(sent)
	if exp.Deleted == 0 || exp.Parked == 0 || exp.Stale == 0 || exp.Poison != 2 {
		t.Fatalf("the stream does not exercise deletes, gaps, copies and poison: %+v", exp)
	}
	if err := demo.Verify(ctx, db.Pool, demo.Table, exp); err != nil {
		t.Fatal(err)
	}
	var dead int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_dead_letters WHERE identity = 'produced'`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 2 {
		t.Errorf("%d dead letters, want the 2 poison pills", dead)
	}
}

func sumOffsets(end map[int32]int64) int64 {
	var n int64
	for o := range maps.Values(end) {
		n += o
	}
	return n
}

// TestProduceDeliveryFailure: records the broker refuses make produce
// fail, naming their lines.
func TestProduceDeliveryFailure(t *testing.T) {
	e := newProduceEnv(t, "orders", 1)
	_, err := e.produce(strings.NewReader("a\nb\n"), "--format", "raw", "--key", "k", "--topic", "missing", "--tombstone", "gone", "--file", writeFile(t, "in", "a\n\nb\n"))
	for _, want := range []string{"3 of 3 records were not produced to missing", `line 1, line 3, tombstone "gone": `} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an error saying %q", err, want)
		}
	}
}

// TestFieldKey: a key field's string is the key as it is, a number its
// decimal text, a union's branch unwrapped; null and other types are
// refused, naming the flag.
func TestFieldKey(t *testing.T) {
	for _, tc := range []struct {
		v       any
		want    string
		wantErr string
	}{
		{"acc-1", "acc-1", ""},
		{int64(-42), "-42", ""},
		{7, "7", ""},
		{map[string]any{"long": int64(9)}, "9", ""},
		{map[string]any{"string": "x"}, "x", ""},
		{nil, "", "--key-field id: the event's id is null"},
		{map[string]any{"null": nil}, "", "--key-field id: the event's id is null"},
		{true, "", "--key-field id: want a string, int or long, got a bool"},
	} {
		got, err := fieldKey("id", tc.v)
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("%v: got %q, %v; want error %q", tc.v, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%v: got %q, %v; want %q", tc.v, got, err, tc.want)
		}
	}
}

// jsonLines is stream's records that projector produce sends as JSON lines
// (neither tombstones, poison pills nor records keyed by another
// aggregate), and those lines, one event each.
func jsonLines(t *testing.T, stream []demo.Record) (sent []demo.Record, lines string) {
	t.Helper()
	var b strings.Builder
	for _, r := range stream {
		if r.Tombstone || r.Poison != "" || r.Key != r.Event.AccountID {
			continue
		}
		ev := r.Event
		line := map[string]any{"account_id": ev.AccountID, "version": ev.Version, "type": ev.Type,
			"amount": ev.Amount, "occurred_at": ev.OccurredAt.Format(time.RFC3339Nano)}
		if ev.Owner != "" {
			line["owner"] = ev.Owner
		}
		j, err := json.Marshal(line)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(j)
		b.WriteByte('\n')
		sent = append(sent, r)
	}
	return sent, b.String()
}
