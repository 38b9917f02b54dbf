package projector_test

import (
	"context"
	"encoding/binary"
	"log/slog"
	"math/big"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks/postgres"
)

// typesSchema has a field of every Avro type the documented mapping
// (docs/types.md) names.
const typesSchema = `{"type": "record", "name": "Typed", "namespace": "test.types", "fields": [
  {"name": "id", "type": "string"},
  {"name": "version", "type": "long"},
  {"name": "type", "type": "string"},
  {"name": "flag", "type": "boolean"},
  {"name": "small", "type": "int"},
  {"name": "big", "type": "long"},
  {"name": "ratio", "type": "double"},
  {"name": "single", "type": "float"},
  {"name": "name", "type": "string"},
  {"name": "ref", "type": "string"},
  {"name": "raw", "type": "bytes"},
  {"name": "fix", "type": {"type": "fixed", "name": "Four", "size": 4}},
  {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}},
  {"name": "tags", "type": {"type": "array", "items": ["null", "string"]}},
  {"name": "longs", "type": {"type": "array", "items": "long"}},
  {"name": "doubles", "type": {"type": "array", "items": "double"}},
  {"name": "bools", "type": {"type": "array", "items": "boolean"}},
  {"name": "colors", "type": {"type": "array", "items": "Color"}},
  {"name": "stamps", "type": {"type": "array", "items": {"type": "long", "logicalType": "timestamp-millis"}}},
  {"name": "maybe_tags", "type": ["null", {"type": "array", "items": "string"}], "default": null},
  {"name": "counts", "type": {"type": "map", "values": "long"}},
  {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
    {"name": "street", "type": "string"}, {"name": "zip", "type": ["null", "int"]}, {"name": "photo", "type": "bytes"}]}},
  {"name": "choice", "type": ["null", "string", "long", "Address"], "default": null},
  {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 30, "scale": 6}},
  {"name": "fprice", "type": {"type": "fixed", "name": "Dec", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 2}},
  {"name": "maybe_price", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}], "default": null},
  {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
  {"name": "at_micros", "type": {"type": "long", "logicalType": "timestamp-micros"}},
  {"name": "local_at", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
  {"name": "day", "type": {"type": "int", "logicalType": "date"}},
  {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
  {"name": "clock_micros", "type": {"type": "long", "logicalType": "time-micros"}},
  {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}}
]}`

// typesSnapshot projects every field of typesSchema into the column types
// the mapping says it may fill.
const typesSnapshot = `
projections:
  - name: typed
    topic: typed
    table: typed
    key: id
    mode: snapshot
    columns:
      id:           {type: text, primary_key: true}
      flag:         {type: boolean}
      flag_text:    {type: text, field: flag}
      small:        {type: smallint}
      big:          {type: bigint}
      big_numeric:  {type: numeric, field: big}
      ratio:        {type: double precision}
      single:       {type: real}
      name:         {type: varchar(20)}
      ref:          {type: uuid}
      raw:          {type: bytea}
      fix:          {type: bytea}
      color:        {type: text}
      color_enum:   {type: color_kind, field: color}
      colors_enum:  {type: "color_kind[]", field: colors}
      tags:         {type: "text[]"}
      tags_json:    {type: jsonb, field: tags}
      longs:        {type: "bigint[]"}
      doubles:      {type: "double precision[]"}
      bools:        {type: "boolean[]"}
      colors:       {type: "text[]"}
      stamps:       {type: "timestamptz[]"}
      maybe_tags:   {type: "text[]"}
      counts:       {type: jsonb}
      address:      {type: jsonb}
      address_json: {type: json, field: address}
      choice:       {type: jsonb}
      choice_text:  {type: text, field: choice}
      price:        {type: numeric}
      price_text:   {type: text, field: price}
      fprice:       {type: "numeric(18,2)"}
      maybe_price:  {type: numeric}
      at:           {type: timestamptz}
      at_plain:     {type: timestamp, field: at}
      at_micros:    {type: timestamptz}
      local_at:     {type: timestamp}
      day:          {type: date}
      day_text:     {type: text, field: day}
      clock:        {type: time}
      clock_micros: {type: time}
      uid:          {type: uuid}
`

// typesFold takes the same events through a fold's set and add verbs.
const typesFold = `
projections:
  - name: typed_fold
    topic: typed_fold
    table: typed_fold
    mode: fold
    key: id
    type_field: type
    columns:
      id:      {type: text, primary_key: true}
      tags:    {type: "text[]"}
      stamps:  {type: "timestamptz[]"}
      address: {type: jsonb}
      price:   {type: numeric}
      total:   {type: numeric, default: 0}
      cents:   {type: "numeric(12,2)"}
      day:     {type: date}
    events:
      priced:
        set: {tags: tags, stamps: stamps, address: address, price: price, day: day}
        add: {total: price, cents: fprice}
      refunded:
        set: {tags: tags}
        add: {total: -price, cents: -fprice}
`

func dec(s string) *big.Rat {
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		panic(s)
	}
	return r
}

// typedEvent is a record of typesSchema: every field filled with values at
// the edges of their types, changed by edit.
func typedEvent(id string, version int64, edit func(map[string]any)) map[string]any {
	loc := time.Local // hamba/avro writes a local timestamp's wall clock in time.Local
	ev := map[string]any{
		"id": id, "version": version, "type": "priced",
		"flag": true, "small": int32(-32768), "big": int64(-9223372036854775808),
		"ratio": 0.1, "single": float32(1.5), "name": `quo"te\back`,
		"ref": "3f0e9c3c-9d7c-4a7e-8a8b-2b7f0a6d1e11", "raw": []byte{0, 0xff, '\\', 'x'}, "fix": [4]byte{1, 2, 3, 4},
		"color": "GREEN",
		"tags":  []any{"a", "b c", nil, "", `q"u\o`, "NULL"},
		"longs": []any{int64(1), int64(-9223372036854775808)}, "doubles": []any{1.5, -0.25, 1e300},
		"bools": []any{true, false}, "colors": []any{"RED", "BLUE"},
		"stamps":     []any{time.UnixMilli(-1).UTC(), time.UnixMilli(1700000000123).UTC()},
		"maybe_tags": []any{},
		"counts":     map[string]any{"x": int64(1), "y<&>": int64(-2)},
		"address":    map[string]any{"street": "Main \"1\"", "zip": nil, "photo": []byte{0xde, 0xad}},
		"choice":     map[string]any{"long": int64(42)},
		"price":      dec("-12345678901234567890.123456"), "fprice": dec("9999999999999999.99"),
		"maybe_price": nil,
		"at":          time.UnixMilli(1700000000123).UTC(), "at_micros": time.UnixMicro(-1).UTC(),
		"local_at":     time.Date(2024, 2, 29, 23, 59, 59, 999999000, loc),
		"day":          time.Date(1969, 7, 20, 0, 0, 0, 0, time.UTC),
		"clock":        13*time.Hour + 14*time.Minute + 15*time.Second + 678*time.Millisecond,
		"clock_micros": 23*time.Hour + 59*time.Minute + 59*time.Second + 999999*time.Microsecond,
		"uid":          "00000000-0000-0000-0000-000000000001",
	}
	if edit != nil {
		edit(ev)
	}
	return ev
}

type typesBundle struct {
	db     *testenv.DB
	kafka  *kfake.Cluster
	reg    *sr.Client
	schema avro.Schema
	id     int
}

func typesSetup(t *testing.T, topics ...string) *typesBundle {
	t.Helper()
	b := &typesBundle{db: testenv.NewDB(t)}
	b.kafka = testenv.Kafka(t, topics[0], 1, kfake.SeedTopics(1, topics[1:]...))
	_, b.reg = testenv.Registry(t)
	var err error
	if b.schema, err = avro.ParseWithCache(typesSchema, "", &avro.SchemaCache{}); err != nil {
		t.Fatal(err)
	}
	for _, topic := range topics {
		ss, err := b.reg.CreateSchema(t.Context(), topic+"-value", sr.Schema{Schema: typesSchema, Type: sr.TypeAvro})
		if err != nil {
			t.Fatal(err)
		}
		b.id = ss.ID
	}
	return b
}

// produce writes events to topic in the wire format, keyed by their id,
// and returns the topic's end offsets.
func (b *typesBundle) produce(t *testing.T, topic string, events ...map[string]any) map[int32]int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, ev := range events {
		body, err := avro.Marshal(b.schema, ev)
		if err != nil {
			t.Fatalf("encode %v: %v", ev["id"], err)
		}
		value := binary.BigEndian.AppendUint32([]byte{0}, uint32(b.id))
		rec := &kgo.Record{Topic: topic, Key: []byte(ev["id"].(string)), Value: append(value, body...)}
		if err := cl.ProduceSync(t.Context(), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	end, err := demo.EndOffsets(t.Context(), kadm.NewClient(cl), topic)
	if err != nil {
		t.Fatal(err)
	}
	return end
}

// run runs the projections of yaml until every topic's end offsets are
// committed.
func (b *typesBundle) run(t *testing.T, yaml string, ends map[string]map[int32]int64) []*projection.Projection {
	t.Helper()
	projs, err := projection.Parse([]byte(yaml), ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(t.Context(), b.db.Pool, projs...); err != nil {
		t.Fatal(err)
	}
	// The decoders projector run uses: the reader schema registered for
	// the topic, pruned to the fields the projection reads.
	decoders, err := projector.RegistryDecoders(t.Context(), b.reg, projs...)
	if err != nil {
		t.Fatal(err)
	}
	e, err := projector.New(projector.Config{
		Brokers:     b.kafka.ListenAddrs(),
		Identity:    "types",
		Projections: projs,
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Store:       postgres.NewStore(b.db.Pool),
	}, decoders)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, e)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for topic, end := range ends {
		if err := demo.WaitCommitted(ctx, b.db.Pool, "types", topic, end, nil); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	return projs
}

// rowText reads the row of key from table, each column in Postgres's text
// form (timestamps in UTC), nil for NULL.
func (b *typesBundle) rowText(t *testing.T, table, key string, cols []string) map[string]*string {
	t.Helper()
	tx, err := b.db.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), `SET LOCAL TimeZone = 'UTC'`); err != nil {
		t.Fatal(err)
	}
	out := map[string]*string{}
	for _, c := range cols {
		var s *string
		if err := tx.QueryRow(t.Context(), `SELECT `+c+`::text FROM `+table+` WHERE id = $1`, key).Scan(&s); err != nil {
			t.Fatalf("%s of %s: %v", c, key, err)
		}
		out[c] = s
	}
	return out
}

func ptr(s string) *string { return &s }

func compareRow(t *testing.T, key string, got map[string]*string, want map[string]*string) {
	t.Helper()
	for c, w := range want {
		g := got[c]
		switch {
		case g == nil && w == nil:
		case g == nil || w == nil || *g != *w:
			t.Errorf("%s.%s = %s, want %s", key, c, show(g), show(w))
		}
	}
}

func show(s *string) string {
	if s == nil {
		return "NULL"
	}
	return "`" + *s + "`"
}

// TestTypeMappingSnapshot writes events with a field of every Avro type
// of the documented mapping into the column types it may fill, and reads
// each value back as Postgres renders it: arrays as arrays (null elements
// kept, empty arrays empty), records, maps and unions as JSON, decimals
// exact, timestamps to the microsecond, a date before 1970, times of day.
// A value its column's type refuses (not a uuid) dead-letters its event,
// naming the column, and the events around it land.
func TestTypeMappingSnapshot(t *testing.T) {
	b := typesSetup(t, "typed")
	full := typedEvent("full", 1, nil)
	nulls := typedEvent("nulls", 1, func(ev map[string]any) {
		ev["tags"], ev["longs"], ev["colors"], ev["stamps"] = []any{}, []any{}, []any{}, []any{}
		ev["maybe_tags"], ev["maybe_price"] = nil, dec("0.10")
		ev["counts"] = map[string]any{}
		ev["price"] = dec("0.000001")
		ev["fprice"] = dec("-0.01")
		ev["address"] = map[string]any{"street": "", "zip": int32(-1), "photo": []byte{}}
		ev["day"] = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
		ev["choice"] = map[string]any{"test.types.Address": map[string]any{"street": "s", "zip": nil, "photo": []byte("x")}}
	})
	str := typedEvent("str", 1, func(ev map[string]any) { ev["choice"] = map[string]any{"string": "not json"} })
	bad := typedEvent("bad", 1, func(ev map[string]any) { ev["ref"] = "not-a-uuid" })
	if _, err := b.db.Pool.Exec(t.Context(), `CREATE TYPE color_kind AS ENUM ('RED', 'GREEN', 'BLUE')`); err != nil {
		t.Fatal(err)
	}
	end := b.produce(t, "typed", full, bad, nulls, str)
	projs := b.run(t, typesSnapshot, map[string]map[int32]int64{"typed": end})

	var cols []string
	for _, c := range projs[0].Columns {
		cols = append(cols, c.Name)
	}
	compareRow(t, "full", b.rowText(t, "typed", "full", cols), map[string]*string{
		"flag": ptr("true"), "flag_text": ptr("true"), "small": ptr("-32768"), "big": ptr("-9223372036854775808"),
		"big_numeric": ptr("-9223372036854775808"), "ratio": ptr("0.1"), "single": ptr("1.5"),
		"name": ptr(`quo"te\back`), "ref": ptr("3f0e9c3c-9d7c-4a7e-8a8b-2b7f0a6d1e11"),
		"raw": ptr(`\x00ff5c78`), "fix": ptr(`\x01020304`), "color": ptr("GREEN"), "color_enum": ptr("GREEN"), "colors_enum": ptr("{RED,BLUE}"),
		"tags":      ptr(`{a,"b c",NULL,"","q\"u\\o","NULL"}`),
		"tags_json": ptr(`["a", "b c", null, "", "q\"u\\o", "NULL"]`),
		"longs":     ptr("{1,-9223372036854775808}"), "doubles": ptr("{1.5,-0.25,1e+300}"),
		"bools": ptr("{t,f}"), "colors": ptr("{RED,BLUE}"),
		"stamps":       ptr(`{"1969-12-31 23:59:59.999+00","2023-11-14 22:13:20.123+00"}`),
		"maybe_tags":   ptr("{}"),
		"counts":       ptr(`{"x": 1, "y<&>": -2}`),
		"address":      ptr(`{"zip": null, "photo": "3q0=", "street": "Main \"1\""}`),
		"address_json": ptr(`{"photo":"3q0=","street":"Main \"1\"","zip":null}`),
		"choice":       ptr(`42`), "choice_text": ptr("42"),
		"price": ptr("-12345678901234567890.123456"), "price_text": ptr("-12345678901234567890.123456"),
		"fprice": ptr("9999999999999999.99"), "maybe_price": nil,
		"at": ptr("2023-11-14 22:13:20.123+00"), "at_plain": ptr("2023-11-14 22:13:20.123"),
		"at_micros": ptr("1969-12-31 23:59:59.999999+00"), "local_at": ptr("2024-02-29 23:59:59.999999"),
		"day": ptr("1969-07-20"), "day_text": ptr("1969-07-20T00:00:00Z"),
		"clock": ptr("13:14:15.678"), "clock_micros": ptr("23:59:59.999999"),
		"uid": ptr("00000000-0000-0000-0000-000000000001"),
	})
	compareRow(t, "nulls", b.rowText(t, "typed", "nulls", cols), map[string]*string{
		"tags": ptr("{}"), "longs": ptr("{}"), "colors": ptr("{}"), "stamps": ptr("{}"), "maybe_tags": nil,
		"counts": ptr("{}"), "address": ptr(`{"zip": -1, "photo": "", "street": ""}`),
		"choice":      ptr(`{"zip": null, "photo": "eA==", "street": "s"}`),
		"choice_text": ptr(`{"photo":"eA==","street":"s","zip":null}`),
		"price":       ptr("0.000001"), "fprice": ptr("-0.01"), "maybe_price": ptr("0.1"),
		"day": ptr("0001-01-01"),
	})
	compareRow(t, "str", b.rowText(t, "typed", "str", cols), map[string]*string{"choice": ptr(`"not json"`), "choice_text": ptr("not json")})

	var n int
	var msg string
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*), min(error) FROM projector_dead_letters`).Scan(&n, &msg); err != nil {
		t.Fatal(err)
	}
	t.Logf("dead letter: %s", msg)
	if n != 1 || !strings.Contains(msg, "column ref (uuid)") || !strings.Contains(msg, "not-a-uuid") {
		t.Errorf("dead letters: %d, error %q; want the event of bad, naming column ref", n, msg)
	}
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM typed WHERE id = 'bad'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("row of bad: %d (%v), want none", n, err)
	}
}

// TestTypeMappingFold takes arrays, a record, decimals and a date through
// a fold's set, and decimals through add (exact, and rounded as a
// numeric(12,2) column rounds), over two events of one aggregate, so
// that the second folds onto the row the first left in memory.
func TestTypeMappingFold(t *testing.T) {
	b := typesSetup(t, "typed_fold")
	end := b.produce(t, "typed_fold",
		typedEvent("a", 1, func(ev map[string]any) { ev["price"], ev["fprice"] = dec("0.1"), dec("10.25") }),
		typedEvent("a", 2, func(ev map[string]any) { ev["price"], ev["fprice"] = dec("0.2"), dec("0.05") }),
		typedEvent("a", 3, func(ev map[string]any) {
			ev["type"], ev["price"], ev["fprice"], ev["tags"] = "refunded", dec("0.000001"), dec("0.01"), []any{}
		}),
		typedEvent("b", 1, func(ev map[string]any) { ev["tags"], ev["fprice"] = []any{nil}, dec("1") }),
	)
	b.run(t, typesFold, map[string]map[int32]int64{"typed_fold": end})
	cols := []string{"tags", "stamps", "address", "price", "total", "cents", "day"}
	compareRow(t, "a", b.rowText(t, "typed_fold", "a", cols), map[string]*string{
		"tags":    ptr("{}"),
		"stamps":  ptr(`{"1969-12-31 23:59:59.999+00","2023-11-14 22:13:20.123+00"}`),
		"address": ptr(`{"zip": null, "photo": "3q0=", "street": "Main \"1\""}`),
		"price":   ptr("0.2"), "total": ptr("0.299999"), "cents": ptr("10.29"), "day": ptr("1969-07-20"),
	})
	compareRow(t, "b", b.rowText(t, "typed_fold", "b", cols), map[string]*string{"tags": ptr("{NULL}")})

	// A new engine folds the next event onto the row as it reads it back
	// from Postgres: arrays, JSON and decimals in the text Postgres renders.
	end = b.produce(t, "typed_fold", typedEvent("a", 4, func(ev map[string]any) {
		ev["price"], ev["fprice"], ev["tags"] = dec("0.000001"), dec("-0.29"), []any{"x", nil}
	}))
	b.run(t, typesFold, map[string]map[int32]int64{"typed_fold": end})
	compareRow(t, "a", b.rowText(t, "typed_fold", "a", cols), map[string]*string{
		"tags":    ptr("{x,NULL}"),
		"stamps":  ptr(`{"1969-12-31 23:59:59.999+00","2023-11-14 22:13:20.123+00"}`),
		"address": ptr(`{"zip": null, "photo": "3q0=", "street": "Main \"1\""}`),
		"price":   ptr("0.000001"), "total": ptr("0.3"), "cents": ptr("10.00"), "day": ptr("1969-07-20"),
	})
	var n int
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM projector_dead_letters`).Scan(&n); err != nil || n != 0 {
		t.Errorf("dead letters: %d (%v), want none", n, err)
	}
}
