package schemas

import (
	"bytes"
	"errors"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
)

const jsonTestSchema = `{
  "type": "record", "name": "Order", "namespace": "shop",
  "fields": [
    {"name": "id", "type": "string"},
    {"name": "version", "type": "long"},
    {"name": "qty", "type": "int"},
    {"name": "price", "type": "double"},
    {"name": "ratio", "type": "float"},
    {"name": "paid", "type": "boolean"},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "ref", "type": ["null", "long", "string"], "default": null},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": "long"}},
    {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "shipped_at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}], "default": null},
    {"name": "due", "type": {"type": "int", "logicalType": "date"}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "order_uuid", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "blob", "type": "bytes"},
    {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 3}},
    {"name": "address", "type": ["null", {"type": "record", "name": "Address", "fields": [
      {"name": "city", "type": "string"},
      {"name": "zip", "type": ["null", "string"], "default": null}
    ]}], "default": null},
    {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
      {"name": "sku", "type": "string"},
      {"name": "n", "type": "int"}
    ]}}},
    {"name": "extra", "type": "string", "default": "none"}
  ]
}`

// want is the value every form of the test event must encode as, built
// by hand in the Go types the encoder takes.
func jsonTestWant() map[string]any {
	return map[string]any{
		"id": "o-1", "version": int64(3), "qty": 2, "price": 9.5, "ratio": float32(0.25), "paid": true,
		"note": "gift", "ref": map[string]any{"long": int64(42)}, "status": "PAID",
		"tags": []any{"a", "b"}, "attrs": map[string]any{"w": int64(7)},
		"placed_at":  time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC),
		"shipped_at": time.Date(2026, 12, 2, 8, 0, 0, 123456000, time.UTC),
		"due":        time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		"amount":     big.NewRat(123456, 100),
		"order_uuid": "6f1c1e4e-8f33-4c1a-9a51-1b2c3d4e5f60",
		"blob":       []byte{0, 1, 0xff},
		"code":       [3]byte{'A', 'B', 'C'},
		"address":    map[string]any{"shop.Address": map[string]any{"city": "Lyon", "zip": nil}},
		"lines":      []any{map[string]any{"sku": "x", "n": 1}},
		"extra":      "none",
	}
}

// TestFromJSONForms: the same event in plain JSON (unions unwrapped,
// logical types in their natural forms) and in Avro's JSON encoding
// (unions tagged, logical types as their underlying numbers and bytes)
// encodes to the same bytes as the value built by hand.
func TestFromJSONForms(t *testing.T) {
	schema := avro.MustParse(jsonTestSchema)
	want, err := AppendWire(nil, 1, schema, jsonTestWant())
	if err != nil {
		t.Fatal(err)
	}
	forms := map[string]string{
		"plain": `{"id": "o-1", "version": 3, "qty": 2, "price": 9.5, "ratio": 0.25, "paid": true,
			"note": "gift", "ref": 42, "status": "PAID", "tags": ["a", "b"], "attrs": {"w": 7},
			"placed_at": "2026-12-01T10:30:00Z", "shipped_at": "2026-12-02T09:00:00.123456+01:00",
			"due": "2026-12-01", "amount": 1234.56, "order_uuid": "6f1c1e4e-8f33-4c1a-9a51-1b2c3d4e5f60",
			"blob": "\u0000\u0001\u00ff", "code": "ABC", "address": {"city": "Lyon"},
			"lines": [{"sku": "x", "n": 1}]}`,
		"avro": `{"id": "o-1", "version": 3, "qty": 2, "price": 9.5, "ratio": 0.25, "paid": true,
			"note": {"string": "gift"}, "ref": {"long": 42}, "status": "PAID", "tags": ["a", "b"], "attrs": {"w": 7},
			"placed_at": 1796121000000, "shipped_at": {"long": 1796198400123456},
			"due": 20788, "amount": "\u0000\u0001\u00e2\u0040", "order_uuid": "6f1c1e4e-8f33-4c1a-9a51-1b2c3d4e5f60",
			"blob": "\u0000\u0001\u00ff", "code": "ABC", "address": {"shop.Address": {"city": "Lyon", "zip": null}},
			"lines": [{"sku": "x", "n": 1}], "extra": "none"}`,
		"mixed": `{"id": "o-1", "version": 3.0, "qty": 2, "price": 9.5, "ratio": 0.25, "paid": true,
			"note": {"string": "gift"}, "ref": {"long": 42}, "status": "PAID", "tags": ["a", "b"], "attrs": {"w": 7},
			"placed_at": 1796121000000, "shipped_at": "2026-12-02T08:00:00.123456Z",
			"due": 20788, "amount": "1234.56", "order_uuid": "6f1c1e4e-8f33-4c1a-9a51-1b2c3d4e5f60",
			"blob": "\u0000\u0001\u00ff", "code": "ABC", "address": {"Address": {"city": "Lyon"}},
			"lines": [{"sku": "x", "n": 1}]}`,
	}
	for name, text := range forms {
		v, err := FromJSON(schema, []byte(text))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		got, err := AppendWire(nil, 1, schema, v)
		if err != nil {
			t.Errorf("%s: encoding: %v", name, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: encodes as\n %x\nwant\n %x", name, got, want)
		}
	}
}

// TestFromJSONUnionBranches: a plain value finds its branch, its own JSON
// type first.
func TestFromJSONUnionBranches(t *testing.T) {
	schema := avro.MustParse(`["null", "long", "string", {"type": "long", "logicalType": "timestamp-millis"}]`)
	for _, tc := range []struct {
		in   string
		want any
	}{
		{`null`, nil},
		{`7`, map[string]any{"long": int64(7)}},
		{`"7"`, map[string]any{"string": "7"}},
		{`"2026-12-01T00:00:00Z"`, map[string]any{"string": "2026-12-01T00:00:00Z"}},
		{`{"long.timestamp-millis": 5}`, map[string]any{"long.timestamp-millis": time.UnixMilli(5).UTC()}},
	} {
		v, err := FromJSON(schema, []byte(tc.in))
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		got, err := AppendWire(nil, 1, schema, v)
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		want, err := AppendWire(nil, 1, schema, tc.want)
		if tc.want == nil {
			want, err = AppendWire(nil, 1, schema, map[string]any{"null": nil})
		}
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: encodes as %x, want %x", tc.in, got, want)
		}
	}
}

// TestFromJSONErrors: what does not fit is refused, naming the field and
// saying what was wanted and what came.
func TestFromJSONErrors(t *testing.T) {
	schema := avro.MustParse(jsonTestSchema)
	base := `"id": "o-1", "version": 3, "qty": 2, "price": 9.5, "ratio": 0.25, "paid": true,
		"status": "PAID", "tags": [], "attrs": {}, "placed_at": 0, "due": 0, "amount": 1,
		"order_uuid": "6f1c1e4e-8f33-4c1a-9a51-1b2c3d4e5f60", "blob": "", "code": "ABC", "lines": []`
	if _, err := FromJSON(schema, []byte("{"+base+"}")); err != nil {
		t.Fatalf("the base event: %v", err)
	}
	for _, tc := range []struct{ in, want string }{
		{`{"version": "ten"}`, `field "version": want long, got "ten"`},
		{`{"qty": 3000000000}`, `field "qty": want int, got 3000000000`},
		{`{"qty": 1.5}`, `field "qty": want int, got 1.5`},
		{`{"status": "LOST"}`, `field "status": want one of NEW, PAID, SHIPPED (enum shop.Status), got "LOST"`},
		{`{"tags": ["a", 1]}`, `field "tags[1]": want string, got 1`},
		{`{"placed_at": "yesterday"}`, `field "placed_at": want an RFC 3339 time`},
		{`{"due": "01/12/2026"}`, `field "due": want a date as YYYY-MM-DD`},
		{`{"amount": 1.234}`, `field "amount": want decimal(10,2), got 1.234: more than 2 digits after the point`},
		{`{"amount": 123456789012}`, `field "amount": want decimal(10,2), got 123456789012: more than 10 digits`},
		{`{"amount": "1e99999999"}`, `field "amount": want decimal(10,2), got "1e99999999": out of range`},
		{`{"amount": 1e-5000}`, `field "amount": want decimal(10,2), got 1e-5000: out of range`},
		{`{"version": 1e5000}`, `field "version": want long, got 1e5000`},
		{`{"amount": "\u007f\u00ff\u00ff\u00ff\u00ff\u00ff"}`, `field "amount": want decimal(10,2), got 15 unscaled digits: more than 10`},
		{`{"order_uuid": "nope"}`, `field "order_uuid": want a uuid`},
		{`{"blob": "€"}`, `field "blob": want bytes as a string of code points 0-255`},
		{`{"code": "AB"}`, `field "code": want 3 bytes`},
		{`{"note": 5}`, `field "note": want string, got 5`},
		{`{"ref": true}`, `field "ref": want one of null, long, string, got true`},
		{`{"address": {"town": "Lyon"}}`, `field "address.city": missing`},
		{`{"lines": [{"sku": "x", "n": 1, "colour": "red"}]}`, `field "lines[0].colour": not a field of record shop.Line`},
		{`{"amout": 1}`, `field "amout": not a field of record shop.Order`},
		{`{"paid": null}`, `field "paid": want boolean, got null`},
	} {
		// The case's fields replace the base event's.
		in := "{" + base + "," + strings.TrimPrefix(tc.in, "{")
		_, err := FromJSON(schema, []byte(in))
		var je *JSONError
		if !errors.As(err, &je) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want a JSONError saying %q", tc.in, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{`{"id": "o-1"`, "not JSON"},
		{`{"id": "o-1"} {}`, "not one JSON value"},
		{`[1]`, "want record shop.Order, got an array"},
		{`{"id": "o-1"}`, `field "version": missing, and the schema gives it no default`},
	} {
		if _, err := FromJSON(schema, []byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error saying %q", tc.in, err, tc.want)
		}
	}
}

// TestFromJSONLogicalForms: each logical type's natural form and its
// underlying number encode alike.
func TestFromJSONLogicalForms(t *testing.T) {
	for _, tc := range []struct {
		schema string
		forms  []string
		want   any
	}{
		{`{"type": "int", "logicalType": "time-millis"}`, []string{`"09:30:00.250"`, `34200250`}, 9*time.Hour + 30*time.Minute + 250*time.Millisecond},
		{`{"type": "long", "logicalType": "time-micros"}`, []string{`"00:00:01.000002"`, `1000002`}, time.Second + 2*time.Microsecond},
		{`{"type": "long", "logicalType": "local-timestamp-millis"}`, []string{`"2026-12-01T09:00:00.5"`, `1796115600500`}, time.Date(2026, 12, 1, 9, 0, 0, 5e8, time.UTC)},
		{`{"type": "long", "logicalType": "timestamp-millis"}`, []string{`"2026-12-01T10:00:00.5+01:00"`, `1796115600500`, `1.7961156005e12`}, time.Date(2026, 12, 1, 9, 0, 0, 5e8, time.UTC)},
		{`{"type": "fixed", "name": "D", "size": 4, "logicalType": "decimal", "precision": 6, "scale": 3}`, []string{`-1.5`, `"-1.500"`, `"\u00ff\u00ff\u00fa\u0024"`}, big.NewRat(-3, 2)},
		{`{"type": "double"}`, []string{`"Infinity"`}, math.Inf(1)},
	} {
		schema := avro.MustParse(tc.schema)
		want, err := AppendWire(nil, 1, schema, tc.want)
		if err != nil {
			t.Fatalf("%s: %v", tc.schema, err)
		}
		for _, f := range tc.forms {
			v, err := FromJSON(schema, []byte(f))
			if err != nil {
				t.Errorf("%s %s: %v", tc.schema, f, err)
				continue
			}
			if got, err := AppendWire(nil, 1, schema, v); err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s %s: encodes as %x (%v), want %x", tc.schema, f, got, err, want)
			}
		}
	}
}

// FuzzFromJSON: no input makes FromJSON panic, and whatever it accepts
// the encoder can encode.
func FuzzFromJSON(f *testing.F) {
	schema := avro.MustParse(jsonTestSchema)
	for _, seed := range []string{`{}`, `null`, `{"id": "x", "ref": {"string": "y"}}`, `{"amount": "1e99"}`, `{"code": "\u00ff\u00ff\u00ff"}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := FromJSON(schema, data)
		if err != nil {
			var je *JSONError
			if !errors.As(err, &je) {
				t.Fatalf("error %v is not a *JSONError", err)
			}
			return
		}
		if _, err := AppendWire(nil, 1, schema, v); err != nil {
			t.Fatalf("FromJSON accepted %s but it does not encode: %v", data, err)
		}
	})
}
