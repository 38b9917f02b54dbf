package outbox

import (
	"encoding/json"
	"math/big"
	"reflect"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
)

const richSchema = `{
  "type": "record", "name": "Rich", "namespace": "t",
  "fields": [
    {"name": "s", "type": "string"},
    {"name": "i", "type": "int"},
    {"name": "l", "type": "long"},
    {"name": "f", "type": "float"},
    {"name": "d", "type": "double"},
    {"name": "b", "type": "boolean"},
    {"name": "raw", "type": "bytes"},
    {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
    {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "tod", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "opt", "type": ["null", "string"], "default": null},
    {"name": "optts", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": null},
    {"name": "multi", "type": ["null", "long", "string", {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]}]},
    {"name": "arr", "type": {"type": "array", "items": "Inner"}},
    {"name": "m", "type": {"type": "map", "values": "double"}},
    {"name": "defaulted", "type": "long", "default": 42},
    {"name": "defstr", "type": ["string", "null"], "default": "dflt"}
  ]
}`

type rich struct {
	S     string             `json:"s"`
	I     int32              `json:"i"`
	L     int64              `json:"l"`
	F     float32            `json:"f"`
	D     float64            `json:"d"`
	B     bool               `json:"b"`
	Raw   []byte             `json:"raw"`
	Fx    []byte             `json:"fx"`
	E     string             `json:"e"`
	TS    time.Time          `json:"ts"`
	TSU   time.Time          `json:"tsu"`
	Day   string             `json:"day"`
	Tod   time.Duration      `json:"tod"`
	Dec   *big.Rat           `json:"dec"`
	Opt   *string            `json:"opt"`
	OptTS *time.Time         `json:"optts,omitempty"`
	Multi any                `json:"multi"`
	Arr   []map[string]any   `json:"arr"`
	M     map[string]float64 `json:"m"`
}

// TestEncodeJSON encodes Go values the way Append stores them (JSON) with
// a schema of every Avro type and decodes them back with hamba.
func TestEncodeJSON(t *testing.T) {
	s := avro.MustParse(richSchema)
	ts := time.Date(2026, 3, 4, 5, 6, 7, 891_000_000, time.UTC)
	opt := "here"
	in := rich{S: "str", I: -7, L: 1 << 40, F: 1.5, D: 2.25, B: true, Raw: []byte{0, 1, 0xff}, Fx: []byte("abcd"),
		E: "GREEN", TS: ts, TSU: ts.Add(123 * time.Microsecond), Day: "2026-03-04", Tod: 90 * time.Minute,
		Dec: big.NewRat(12345, 100), Opt: &opt, Multi: "text", Arr: []map[string]any{{"x": 1}, {"x": 2}},
		M: map[string]float64{"a": 0.5}}
	js, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	wire, err := EncodeJSON(99, s, js)
	if err != nil {
		t.Fatalf("encode %s: %v", js, err)
	}
	if wire[0] != 0 || wire[4] != 99 {
		t.Fatalf("wire header % x", wire[:5])
	}
	var out map[string]any
	if err := avro.Unmarshal(s, wire[5:], &out); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"s": "str", "i": -7, "l": int64(1 << 40), "f": float32(1.5), "d": 2.25, "b": true, "raw": []byte{0, 1, 0xff},
		"fx": [4]byte{'a', 'b', 'c', 'd'}, "e": "GREEN", "ts": ts, "tsu": ts.Add(123 * time.Microsecond),
		"day": time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC), "tod": 90 * time.Minute, "opt": "here", "optts": nil,
		"multi": map[string]any{"string": "text"}, "defaulted": int64(42), "defstr": "dflt",
		"arr": []any{map[string]any{"x": 1}, map[string]any{"x": 2}}, "m": map[string]any{"a": 0.5},
	}
	for k, w := range want {
		if !reflect.DeepEqual(out[k], w) {
			t.Errorf("%s: got %#v, want %#v", k, out[k], w)
		}
	}
	if r, ok := out["dec"].(*big.Rat); !ok || r.Cmp(big.NewRat(12345, 100)) != 0 {
		t.Errorf("dec: got %#v, want 123.45", out["dec"])
	}

	// Union branches (hamba decodes a union of several types as
	// {branch: value}): a number picks long, an object the record, the
	// Avro JSON form names the branch; epoch millis for a timestamp.
	for _, tc := range []struct {
		multi string
		want  any
	}{
		{`12`, map[string]any{"long": int64(12)}},
		{`{"x": 3}`, map[string]any{"t.Inner": map[string]any{"x": 3}}},
		{`{"string": "named"}`, map[string]any{"string": "named"}},
		{`null`, nil},
	} {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(js, &m); err != nil {
			t.Fatal(err)
		}
		m["multi"], m["optts"] = json.RawMessage(tc.multi), json.RawMessage(`1700000000000`)
		js, _ := json.Marshal(m)
		wire, err := EncodeJSON(1, s, js)
		if err != nil {
			t.Fatalf("multi %s: %v", tc.multi, err)
		}
		var out map[string]any
		if err := avro.Unmarshal(s, wire[5:], &out); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(out["multi"], tc.want) {
			t.Errorf("multi %s: got %#v, want %#v", tc.multi, out["multi"], tc.want)
		}
		if got, _ := out["optts"].(time.Time); !got.Equal(time.UnixMilli(1700000000000)) {
			t.Errorf("optts from epoch millis: got %v", out["optts"])
		}
	}

	for _, bad := range []string{
		`{"s": 1}`,                        // wrong type
		`{"s": "x", "i": 1.5}`,            // not an integer
		`{"s": "x", "i": 3000000000}`,     // overflows int
		`[1]`,                             // not a record
		`{"s": "x", "e": "BLUE"}`,         // not a symbol
		`{"s": "x", "fx": "YWJj"}`,        // 3 bytes for a fixed 4
		`{"s": "x", "ts": "yesterday"}`,   // not a time
		`{"s": "x", "raw": "not base64"}`, // bytes are base64
	} {
		if _, err := EncodeJSON(1, s, []byte(bad)); err == nil {
			t.Errorf("%s: encoded without error", bad)
		}
	}
}
