package schemas

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/big"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

const subject = "accounts-value"

// incompatibleText is AccountEvent with version as a string: a long reader
// field cannot read it.
const incompatibleText = `{
  "type": "record", "name": "AccountEvent", "namespace": "demo.accounts",
  "fields": [
    {"name": "account_id", "type": "string"},
    {"name": "version", "type": "string"},
    {"name": "type", "type": "string"},
    {"name": "owner", "type": ["null", "string"], "default": null},
    {"name": "amount", "type": "long", "default": 0},
    {"name": "occurred_at", "type": {"type": "long", "logicalType": "timestamp-millis"}}
  ]
}`

// env is an srfake registry with the demo schemas registered.
type env struct {
	fake   *srfake.Registry
	cl     *sr.Client
	v1, v2 avro.Schema
	v1ID   int
	v2ID   int
}

func newEnv(tb testing.TB) *env {
	tb.Helper()
	fake := srfake.New()
	tb.Cleanup(fake.Close)
	cl, err := sr.NewClient(sr.URLs(fake.URL()))
	if err != nil {
		tb.Fatal(err)
	}
	demo, err := fixtures()
	if err != nil {
		tb.Fatal(err)
	}
	ids, err := Register(tb.Context(), cl, subject, demo["account_event"], demo["account_event_v2"])
	if err != nil {
		tb.Fatal(err)
	}
	if len(ids) != 2 || ids[0] == ids[1] {
		tb.Fatalf("Register ids = %v, want two distinct ids", ids)
	}
	return &env{
		fake: fake, cl: cl,
		v1: parse(tb, demo["account_event"]), v2: parse(tb, demo["account_event_v2"]),
		v1ID: ids[0], v2ID: ids[1],
	}
}

func parse(tb testing.TB, text string) avro.Schema {
	tb.Helper()
	s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func wire(tb testing.TB, id int, schema avro.Schema, v any) []byte {
	tb.Helper()
	b, err := AppendWire(nil, id, schema, v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

var at = time.Date(2024, 5, 17, 9, 30, 15, 123_000_000, time.UTC)

func event() map[string]any {
	return map[string]any{
		"account_id":  "acc-1",
		"version":     int64(3),
		"type":        "Deposited",
		"owner":       "ada",
		"amount":      int64(2500),
		"occurred_at": at,
	}
}

func eventV2() map[string]any {
	e := event()
	e["currency"] = "CHF"
	return e
}

func checkV1Fields(t *testing.T, rec map[string]any) {
	t.Helper()
	want := map[string]any{
		"account_id": "acc-1",
		"version":    int64(3),
		"type":       "Deposited",
		"owner":      "ada",
		"amount":     int64(2500),
	}
	for k, w := range want {
		if got := rec[k]; got != w {
			t.Errorf("%s = %#v (%T), want %#v (%T)", k, got, got, w, w)
		}
	}
	ts, ok := rec["occurred_at"].(time.Time)
	if !ok || !ts.Equal(at) || ts.Location() != time.UTC {
		t.Errorf("occurred_at = %#v, want %v in UTC", rec["occurred_at"], at)
	}
}

func mustDecode(t *testing.T, d *Decoder, value []byte) (map[string]any, int) {
	t.Helper()
	rec, id, err := d.Decode(t.Context(), value)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	return rec, id
}

func TestRoundTripV1(t *testing.T) {
	e := newEnv(t)
	d := NewDecoder(e.cl, e.v1)
	rec, id := mustDecode(t, d, wire(t, e.v1ID, e.v1, event()))
	if id != e.v1ID {
		t.Errorf("id = %d, want %d", id, e.v1ID)
	}
	checkV1Fields(t, rec)
	if len(rec) != 6 {
		t.Errorf("record has %d fields, want 6: %v", len(rec), rec)
	}

	// A null owner comes back as nil, not as a tagged map.
	ev := event()
	ev["owner"] = nil
	rec, _ = mustDecode(t, d, wire(t, e.v1ID, e.v1, ev))
	if v, ok := rec["owner"]; !ok || v != nil {
		t.Errorf("owner = %#v (present %v), want nil", v, ok)
	}
}

func TestV2WriterV1Reader(t *testing.T) {
	e := newEnv(t)
	d := NewDecoder(e.cl, e.v1)
	rec, id := mustDecode(t, d, wire(t, e.v2ID, e.v2, eventV2()))
	if id != e.v2ID {
		t.Errorf("id = %d, want %d", id, e.v2ID)
	}
	checkV1Fields(t, rec)
	if _, ok := rec["currency"]; ok {
		t.Errorf("v1 reader got currency: %v", rec)
	}
}

func TestV1WriterV2Reader(t *testing.T) {
	e := newEnv(t)
	d := NewDecoder(e.cl, e.v2)
	rec, _ := mustDecode(t, d, wire(t, e.v1ID, e.v1, event()))
	checkV1Fields(t, rec)
	if rec["currency"] != "EUR" {
		t.Errorf("currency = %#v, want default EUR", rec["currency"])
	}
	// And a v2 writer keeps its own value.
	rec, _ = mustDecode(t, d, wire(t, e.v2ID, e.v2, eventV2()))
	if rec["currency"] != "CHF" {
		t.Errorf("currency = %#v, want CHF", rec["currency"])
	}
}

func TestNilReaderDecodesAsWritten(t *testing.T) {
	e := newEnv(t)
	d := NewDecoder(e.cl, nil)
	rec, _ := mustDecode(t, d, wire(t, e.v1ID, e.v1, event()))
	checkV1Fields(t, rec)
	if _, ok := rec["currency"]; ok {
		t.Errorf("v1 writer, no reader: got currency")
	}
	rec, _ = mustDecode(t, d, wire(t, e.v2ID, e.v2, eventV2()))
	checkV1Fields(t, rec)
	if rec["currency"] != "CHF" {
		t.Errorf("currency = %#v, want CHF", rec["currency"])
	}
}

func TestMalformed(t *testing.T) {
	e := newEnv(t)
	d := NewDecoder(e.cl, e.v1)
	good := wire(t, e.v1ID, e.v1, event())
	bad := append([]byte{}, good...)
	bad[0] = 1
	for name, v := range map[string][]byte{
		"nil":       nil,
		"empty":     {},
		"short":     good[:4],
		"bad magic": bad,
	} {
		_, _, err := d.Decode(t.Context(), v)
		if !errors.Is(err, ErrMalformed) || !IsTerminal(err) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
}

func TestUnknownSchema(t *testing.T) {
	e := newEnv(t)
	d := NewDecoder(e.cl, e.v1)
	const id = 4242
	value := wire(t, id, e.v1, event())
	rec, gotID, err := d.Decode(t.Context(), value)
	if !errors.Is(err, ErrUnknownSchema) || !IsTerminal(err) || rec != nil {
		t.Fatalf("Decode = %v, %v, want ErrUnknownSchema", rec, err)
	}
	if gotID != id {
		t.Errorf("id = %d, want %d", gotID, id)
	}
	var re *sr.ResponseError
	if !errors.As(err, &re) || re.ErrorCode != sr.ErrSchemaNotFound.Code {
		t.Errorf("err does not carry the registry's 40403: %v", err)
	}

	// Not cached negatively: once registered, the id decodes.
	demo, _ := fixtures()
	e.fake.SeedSchema("late-value", 1, id, sr.Schema{Schema: demo["account_event"]})
	rec, _ = mustDecode(t, d, value)
	checkV1Fields(t, rec)
}

func TestUndecodable(t *testing.T) {
	e := newEnv(t)
	d := NewDecoder(e.cl, e.v1)
	good := wire(t, e.v1ID, e.v1, event())
	header := good[:5]
	cases := map[string][]byte{
		"garbage":        append(append([]byte{}, header...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff),
		"negative len":   append(append([]byte{}, header...), 0x01),
		"empty body":     append([]byte{}, header...),
		"truncated":      good[:len(good)-1],
		"truncated more": good[:len(good)/2],
		"trailing bytes": append(append([]byte{}, good...), 0),
		"bad union":      append(append([]byte{}, header...), 0x02, 'a', 0x06, 0x02, 'x', 0x0a, 0x00, 0x00),
	}
	for name, v := range cases {
		rec, _, err := d.Decode(t.Context(), v)
		if !errors.Is(err, ErrUndecodable) || !IsTerminal(err) || rec != nil {
			t.Errorf("%s: Decode = %v, %v, want ErrUndecodable", name, rec, err)
		}
	}
	// A good value still decodes with the same (pooled) readers.
	rec, _ := mustDecode(t, d, good)
	checkV1Fields(t, rec)
}

// countingRegistry counts registry calls and can delay or fail them.
type countingRegistry struct {
	reg   Registry
	calls atomic.Int64
	delay time.Duration
	fail  atomic.Int64 // fail this many calls with a transient error first
}

var errFlaky = errors.New("registry briefly unavailable")

func (c *countingRegistry) SchemaByID(ctx context.Context, id int) (sr.Schema, error) {
	c.calls.Add(1)
	if c.delay > 0 {
		time.Sleep(c.delay)
	}
	if c.fail.Add(-1) >= 0 {
		return sr.Schema{}, errFlaky
	}
	return c.reg.SchemaByID(ctx, id)
}

func TestIncompatible(t *testing.T) {
	e := newEnv(t)
	ids, err := Register(t.Context(), e.cl, "other-value", incompatibleText)
	if err != nil {
		t.Fatal(err)
	}
	bad := parse(t, incompatibleText)
	ev := event()
	ev["version"] = "three"
	value := wire(t, ids[0], bad, ev)

	reg := &countingRegistry{reg: e.cl}
	d := NewDecoder(reg, e.v1)
	for range 2 {
		rec, _, err := d.Decode(t.Context(), value)
		if !errors.Is(err, ErrIncompatible) || !IsTerminal(err) || rec != nil {
			t.Fatalf("Decode = %v, %v, want ErrIncompatible", rec, err)
		}
	}
	// An id's schema never changes, so incompatibility is cached.
	if n := reg.calls.Load(); n != 1 {
		t.Errorf("registry calls = %d, want 1", n)
	}

	// Without a reader schema the same value decodes as written.
	rec, _ := mustDecode(t, NewDecoder(e.cl, nil), value)
	if rec["version"] != "three" {
		t.Errorf("version = %#v, want three", rec["version"])
	}
}

func TestIncompatibleKinds(t *testing.T) {
	e := newEnv(t)
	recursive := `{"type":"record","name":"AccountEvent","namespace":"demo.accounts","fields":[
		{"name":"account_id","type":"string"},
		{"name":"next","type":["null","AccountEvent"],"default":null}]}`
	cases := map[string]sr.Schema{
		"not a record": {Schema: `"string"`},
		"recursive":    {Schema: recursive},
		"other name":   {Schema: `{"type":"record","name":"Other","fields":[{"name":"a","type":"long"}]}`},
		"json schema":  {Schema: `{"type":"object"}`, Type: sr.TypeJSON},
	}
	id := 5000
	for name, s := range cases {
		id++
		e.fake.SeedSchema("kinds-"+name, 1, id, s)
		value := []byte{0, 0, 0, byte(id >> 8), byte(id), 0}
		_, _, err := NewDecoder(e.cl, e.v1).Decode(t.Context(), value)
		if !errors.Is(err, ErrIncompatible) {
			t.Errorf("%s: err = %v, want ErrIncompatible", name, err)
		}
	}
}

func TestRecursiveWriterWithoutReader(t *testing.T) {
	e := newEnv(t)
	text := `{"type":"record","name":"Node","fields":[
		{"name":"v","type":"long"},
		{"name":"next","type":["null","Node"],"default":null}]}`
	ids, err := Register(t.Context(), e.cl, "nodes-value", text)
	if err != nil {
		t.Fatal(err)
	}
	s := parse(t, text)
	value := wire(t, ids[0], s, map[string]any{"v": int64(1), "next": map[string]any{"Node": map[string]any{"v": int64(2), "next": nil}}})
	rec, _ := mustDecode(t, NewDecoder(e.cl, nil), value)
	next, ok := rec["next"].(map[string]any)
	if !ok || next["v"] != int64(2) || next["next"] != nil {
		t.Errorf("rec = %#v, want next untagged {v:2 next:nil}", rec)
	}
}

func TestConcurrentLookupsCollapse(t *testing.T) {
	e := newEnv(t)
	reg := &countingRegistry{reg: e.cl, delay: 50 * time.Millisecond}
	d := NewDecoder(reg, e.v1)
	value := wire(t, e.v2ID, e.v2, eventV2())

	const n = 50
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			rec, _, err := d.Decode(t.Context(), value)
			if err == nil && rec["account_id"] != "acc-1" {
				err = errors.New("wrong record")
			}
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := reg.calls.Load(); got != 1 {
		t.Errorf("registry calls = %d, want 1", got)
	}
	// Cached now: no further calls.
	mustDecode(t, d, value)
	if got := reg.calls.Load(); got != 1 {
		t.Errorf("registry calls after cached decode = %d, want 1", got)
	}
}

func checkTransient(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("Decode succeeded, want a transient error")
	}
	if IsTerminal(err) {
		t.Errorf("err = %v is terminal, want transient", err)
	}
	for _, s := range []error{ErrMalformed, ErrUnknownSchema, ErrIncompatible, ErrUndecodable} {
		if errors.Is(err, s) {
			t.Errorf("err = %v matches %v", err, s)
		}
	}
}

func TestRegistryUnreachable(t *testing.T) {
	e := newEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cl, err := sr.NewClient(sr.URLs("http://" + addr))
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = NewDecoder(cl, e.v1).Decode(t.Context(), wire(t, e.v1ID, e.v1, event()))
	checkTransient(t, err)

	// A closed srfake behaves the same.
	d := NewDecoder(e.cl, e.v1)
	e.fake.Close()
	_, _, err = d.Decode(t.Context(), wire(t, e.v1ID, e.v1, event()))
	checkTransient(t, err)
}

func TestRegistryServerError(t *testing.T) {
	e := newEnv(t)
	e.fake.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"error_code":50001,"message":"store error"}`))
		return true
	})
	d := NewDecoder(e.cl, e.v1)
	value := wire(t, e.v1ID, e.v1, event())
	_, _, err := d.Decode(t.Context(), value)
	checkTransient(t, err)

	// Transient failures are not cached.
	e.fake.ClearInterceptors()
	rec, _ := mustDecode(t, d, value)
	checkV1Fields(t, rec)
}

func TestTransientNotCached(t *testing.T) {
	e := newEnv(t)
	reg := &countingRegistry{reg: e.cl}
	reg.fail.Store(1)
	d := NewDecoder(reg, e.v1)
	value := wire(t, e.v1ID, e.v1, event())
	_, _, err := d.Decode(t.Context(), value)
	checkTransient(t, err)
	if !errors.Is(err, errFlaky) {
		t.Errorf("err = %v does not wrap the registry's error", err)
	}
	rec, _ := mustDecode(t, d, value)
	checkV1Fields(t, rec)
	if got := reg.calls.Load(); got != 2 {
		t.Errorf("registry calls = %d, want 2", got)
	}
}

func TestCanceledContext(t *testing.T) {
	e := newEnv(t)
	d := NewDecoder(e.cl, e.v1)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, _, err := d.Decode(ctx, wire(t, e.v1ID, e.v1, event()))
	checkTransient(t, err)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
}

func TestCallerGivingUpDoesNotFailOthers(t *testing.T) {
	e := newEnv(t)
	reg := &countingRegistry{reg: e.cl, delay: 100 * time.Millisecond}
	d := NewDecoder(reg, e.v1)
	value := wire(t, e.v1ID, e.v1, event())

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	_, _, err := d.Decode(ctx, value) // starts the lookup, gives up early
	if !errors.Is(err, context.DeadlineExceeded) || IsTerminal(err) {
		t.Errorf("err = %v, want transient DeadlineExceeded", err)
	}
	rec, _ := mustDecode(t, d, value) // joins the same lookup
	checkV1Fields(t, rec)
	if got := reg.calls.Load(); got != 1 {
		t.Errorf("registry calls = %d, want 1", got)
	}
}

// richText exercises the union normalisation and the documented Go types.
const richText = `{
  "type": "record", "name": "Rich", "namespace": "demo.test",
  "fields": [
    {"name": "i", "type": "int"},
    {"name": "f", "type": "float"},
    {"name": "d", "type": "double"},
    {"name": "b", "type": "boolean"},
    {"name": "raw", "type": "bytes"},
    {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
    {"name": "fx", "type": {"type": "fixed", "name": "Two", "size": 2}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "opt_str_first", "type": ["string", "null"]},
    {"name": "opt_bytes", "type": ["null", "bytes"]},
    {"name": "opt_ts", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
    {"name": "opt_local", "type": ["null", {"type": "long", "logicalType": "local-timestamp-millis"}]},
    {"name": "opt_rec", "type": ["null", {"type": "record", "name": "Inner", "fields": [
      {"name": "note", "type": ["null", "string"]},
      {"name": "tags", "type": ["null", {"type": "array", "items": ["null", "Color"]}]}
    ]}]},
    {"name": "opt_map", "type": ["null", {"type": "map", "values": ["null", "Inner"]}]},
    {"name": "list", "type": {"type": "array", "items": ["null", "Inner"]}},
    {"name": "multi", "type": ["null", "long", "Inner"]},
    {"name": "prim_multi", "type": ["null", "long", "string"]}
  ]
}`

func TestDecodedTypes(t *testing.T) {
	e := newEnv(t)
	ids, err := Register(t.Context(), e.cl, "rich-value", richText)
	if err != nil {
		t.Fatal(err)
	}
	s := parse(t, richText)
	inner := map[string]any{"note": "n", "tags": []any{"RED", nil}}
	day := time.Date(2024, 5, 17, 0, 0, 0, 0, time.UTC)
	in := map[string]any{
		"i": 7, "f": float32(1.5), "d": 2.5, "b": true, "raw": []byte{1, 2},
		"color": "GREEN", "fx": [2]byte{3, 4}, "day": day, "dec": big.NewRat(1234, 100),
		"opt_str_first": "s",
		"opt_bytes":     []byte{5},
		"opt_ts":        at,
		"opt_local":     map[string]any{"long.local-timestamp-millis": at},
		"opt_rec":       map[string]any{"demo.test.Inner": inner},
		"opt_map":       map[string]any{"map": map[string]any{"k": map[string]any{"demo.test.Inner": inner}, "z": nil}},
		"list":          []any{map[string]any{"demo.test.Inner": inner}, nil},
		"multi":         map[string]any{"demo.test.Inner": inner},
		"prim_multi":    int64(9),
	}
	// Hamba's encoder wants the tagged form for these unions; tags inside
	// inner's array too.
	inner["tags"] = map[string]any{"array": []any{map[string]any{"demo.test.Color": "RED"}, nil}}
	rec, _ := mustDecode(t, NewDecoder(e.cl, nil), wire(t, ids[0], s, in))

	check := func(name string, got, want any) {
		t.Helper()
		switch w := want.(type) {
		case []byte:
			if g, ok := got.([]byte); !ok || !bytes.Equal(g, w) {
				t.Errorf("%s = %#v, want %#v", name, got, want)
			}
		default:
			if got != want {
				t.Errorf("%s = %#v (%T), want %#v (%T)", name, got, got, want, want)
			}
		}
	}
	check("i", rec["i"], 7)
	check("f", rec["f"], float32(1.5))
	check("d", rec["d"], 2.5)
	check("b", rec["b"], true)
	check("raw", rec["raw"], []byte{1, 2})
	check("color", rec["color"], "GREEN")
	// hamba/avro decodes short bytes and strings into one shared slab:
	// appending to a decoded []byte must not reach the strings after it.
	raw := rec["raw"].([]byte)
	if cap(raw) != len(raw) {
		t.Errorf("cap(raw) = %d, want %d", cap(raw), len(raw))
	}
	_ = append(raw, "XXXXXXXX"...)
	check("opt_str_first after append to raw", rec["opt_str_first"], "s")
	check("opt_bytes", rec["opt_bytes"], []byte{5})
	if b := rec["opt_bytes"].([]byte); cap(b) != len(b) {
		t.Errorf("cap(opt_bytes) = %d, want %d", cap(b), len(b))
	}
	check("fx", rec["fx"], [2]byte{3, 4})
	check("day", rec["day"], day)
	if r, ok := rec["dec"].(*big.Rat); !ok || r.Cmp(big.NewRat(1234, 100)) != 0 {
		t.Errorf("dec = %#v", rec["dec"])
	}
	check("opt_str_first", rec["opt_str_first"], "s")
	check("opt_ts", rec["opt_ts"], at)
	if ts, ok := rec["opt_local"].(time.Time); !ok || !ts.Equal(at) {
		t.Errorf("opt_local = %#v, want a time.Time", rec["opt_local"])
	}
	wantInner := func(name string, v any) {
		t.Helper()
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s = %#v, want an untagged record", name, v)
		}
		check(name+".note", m["note"], "n")
		tags, ok := m["tags"].([]any)
		if !ok || len(tags) != 2 || tags[0] != "RED" || tags[1] != nil {
			t.Errorf("%s.tags = %#v, want [RED nil]", name, m["tags"])
		}
	}
	wantInner("opt_rec", rec["opt_rec"])
	om, ok := rec["opt_map"].(map[string]any)
	if !ok || len(om) != 2 || om["z"] != nil {
		t.Fatalf("opt_map = %#v", rec["opt_map"])
	}
	wantInner("opt_map.k", om["k"])
	list, ok := rec["list"].([]any)
	if !ok || len(list) != 2 || list[1] != nil {
		t.Fatalf("list = %#v", rec["list"])
	}
	wantInner("list[0]", list[0])
	multi, ok := rec["multi"].(map[string]any)
	if !ok || len(multi) != 1 {
		t.Fatalf("multi = %#v, want the tagged form", rec["multi"])
	}
	wantInner("multi[Inner]", multi["demo.test.Inner"])
	check("prim_multi", rec["prim_multi"], int64(9))

	// Nulls everywhere.
	for _, k := range []string{"opt_str_first", "opt_bytes", "opt_ts", "opt_local", "opt_rec", "opt_map", "multi", "prim_multi"} {
		in[k] = nil
	}
	rec, _ = mustDecode(t, NewDecoder(e.cl, nil), wire(t, ids[0], s, in))
	for _, k := range []string{"opt_str_first", "opt_bytes", "opt_ts", "opt_local", "opt_rec", "opt_map", "multi", "prim_multi"} {
		if v, ok := rec[k]; !ok || v != nil {
			t.Errorf("%s = %#v (present %v), want nil", k, v, ok)
		}
	}
}

func TestAppendWire(t *testing.T) {
	e := newEnv(t)
	prefix := []byte("keep")
	b, err := AppendWire(prefix, 0x01020304, e.v1, event())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("keep\x00\x01\x02\x03\x04")) || len(b) <= 9 {
		t.Errorf("AppendWire = %x", b)
	}
	for _, id := range []int{-1, 1 << 31} {
		if got, err := AppendWire(prefix, id, e.v1, event()); err == nil || !bytes.Equal(got, prefix) {
			t.Errorf("id %d: AppendWire = %x, %v; want an error and dst unchanged", id, got, err)
		}
	}
	bad := event()
	delete(bad, "account_id")
	if got, err := AppendWire(prefix, 1, e.v1, bad); err == nil || !bytes.Equal(got, prefix) {
		t.Errorf("missing field: AppendWire = %x, %v; want an error and dst unchanged", got, err)
	}
}

func FuzzDecode(f *testing.F) {
	e := newEnv(f)
	ids, err := Register(f.Context(), e.cl, "other-value", incompatibleText)
	if err != nil {
		f.Fatal(err)
	}
	incompatible := parse(f, incompatibleText)
	ev := event()
	ev["version"] = "v"

	v1 := wire(f, e.v1ID, e.v1, event())
	noOwner := event()
	noOwner["owner"] = nil
	for _, seed := range [][]byte{
		v1,
		wire(f, e.v1ID, e.v1, noOwner),
		wire(f, e.v2ID, e.v2, eventV2()),
		wire(f, ids[0], incompatible, ev),
		v1[:len(v1)-1],
		append(append([]byte{}, v1...), 0),
		v1[:5],
		{0, 0, 0, 0x10, 0x92, 1},
		{1},
	} {
		f.Add(seed)
	}

	decoders := []*Decoder{NewDecoder(e.cl, e.v1), NewDecoder(e.cl, e.v2), NewDecoder(e.cl, nil)}
	f.Fuzz(func(t *testing.T, value []byte) {
		for _, d := range decoders {
			rec, _, err := d.Decode(t.Context(), value)
			if (err == nil) == (rec == nil) {
				t.Fatalf("Decode(%x) = %v, %v: want exactly one of record and error", value, rec, err)
			}
			if err != nil && !IsTerminal(err) {
				t.Fatalf("Decode(%x): transient error with a live registry: %v", value, err)
			}
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	e := newEnv(b)
	for _, bc := range []struct {
		name   string
		reader avro.Schema
		id     int
		value  []byte
	}{
		{"v1->v1", e.v1, e.v1ID, wire(b, e.v1ID, e.v1, event())},
		{"v2->v1", e.v1, e.v2ID, wire(b, e.v2ID, e.v2, eventV2())},
		{"v1->v2", e.v2, e.v1ID, wire(b, e.v1ID, e.v1, event())},
	} {
		b.Run(bc.name, func(b *testing.B) {
			d := NewDecoder(e.cl, bc.reader)
			ctx := b.Context()
			if _, _, err := d.Decode(ctx, bc.value); err != nil { // warm the cache
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.value)))
			for b.Loop() {
				if _, _, err := d.Decode(ctx, bc.value); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestUnionsAsJSON: with the option a union of several non-null branches
// decodes to its branch's value as JSON, so that a string branch is told
// from JSON text and no branch name reaches a json column; a union with one
// non-null branch decodes as without it.
func TestUnionsAsJSON(t *testing.T) {
	e := newEnv(t)
	ids, err := Register(t.Context(), e.cl, "rich-value", richText)
	if err != nil {
		t.Fatal(err)
	}
	s := parse(t, richText)
	tagged := func() map[string]any {
		return map[string]any{"demo.test.Inner": map[string]any{"note": "n", "tags": map[string]any{"array": []any{map[string]any{"demo.test.Color": "RED"}, nil}}}}
	}
	in := map[string]any{
		"i": 7, "f": float32(1.5), "d": 2.5, "b": true, "raw": []byte{1, 2},
		"color": "GREEN", "fx": [2]byte{3, 4}, "day": time.Date(2024, 5, 17, 0, 0, 0, 0, time.UTC), "dec": big.NewRat(1234, 100),
		"opt_str_first": "s", "opt_bytes": []byte{5}, "opt_ts": at, "opt_local": nil,
		"opt_rec": tagged(), "opt_map": nil, "list": []any{},
		"multi": tagged(), "prim_multi": map[string]any{"string": `{"not": "json"}`},
	}
	d := NewDecoder(e.cl, nil, UnionsAsJSON())
	rec, _ := mustDecode(t, d, wire(t, ids[0], s, in))
	if got, ok := rec["multi"].(json.RawMessage); !ok || string(got) != `{"note":"n","tags":["RED",null]}` {
		t.Errorf("multi = %#v, want its record as JSON", rec["multi"])
	}
	if got, ok := rec["prim_multi"].(json.RawMessage); !ok || string(got) != `"{\"not\": \"json\"}"` {
		t.Errorf("prim_multi = %#v, want a JSON string", rec["prim_multi"])
	}
	if _, ok := rec["opt_rec"].(map[string]any); !ok {
		t.Errorf("opt_rec = %#v, want the record, as without the option", rec["opt_rec"])
	}
	in["multi"], in["prim_multi"] = nil, int64(-3)
	rec, _ = mustDecode(t, d, wire(t, ids[0], s, in))
	if rec["multi"] != nil {
		t.Errorf("multi = %#v, want nil", rec["multi"])
	}
	if got, ok := rec["prim_multi"].(json.RawMessage); !ok || string(got) != `-3` {
		t.Errorf("prim_multi = %#v, want -3", rec["prim_multi"])
	}
}
