package schemas

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"pgregory.net/rapid"
)

// flatKinds are the field types the flat decoder knows, as Avro JSON.
var flatKinds = []string{
	`"boolean"`, `"int"`, `"long"`, `"float"`, `"double"`, `"string"`, `"bytes"`,
	`{"type": "long", "logicalType": "timestamp-millis"}`,
	`{"type": "long", "logicalType": "timestamp-micros"}`,
	`{"type": "enum", "name": "E%d", "symbols": ["A", "B", "C"]}`,
	`{"type": "fixed", "name": "F%d", "size": 3}`,
	`{"type": "array", "items": "long"}`, // never flat
}

type genField struct {
	name     string
	kind     int
	nullable int // 0: not a union, 1: ["null", T], 2: [T, "null"]
}

func (f genField) avroType(i int) string {
	t := flatKinds[f.kind]
	if f.kind >= 9 && f.kind <= 10 {
		t = fmt.Sprintf(t, i)
	}
	switch f.nullable {
	case 1:
		return `["null", ` + t + `]`
	case 2:
		return `[` + t + `, "null"]`
	}
	return t
}

func recordJSON(fields []genField, types []string, extra string) string {
	s := `{"type": "record", "name": "R", "fields": [`
	for i, f := range fields {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf(`{"name": %q, "type": %s}`, f.name, types[i])
	}
	if extra != "" {
		if len(fields) > 0 {
			s += ", "
		}
		s += extra
	}
	return s + `]}`
}

func genValue(t *rapid.T, f genField, i int) any {
	label := f.name
	if f.nullable > 0 && rapid.Bool().Draw(t, label+"-null") {
		return nil
	}
	v := genScalar(t, f, label)
	if f.nullable > 0 && f.kind >= 9 {
		// hamba/avro encodes a named or complex union branch from its
		// tagged form only.
		name := map[int]string{9: "E%d", 10: "F%d", 11: "array"}[f.kind]
		if f.kind != 11 {
			name = fmt.Sprintf(name, i)
		}
		return map[string]any{name: v}
	}
	return v
}

func genScalar(t *rapid.T, f genField, label string) any {
	switch f.kind {
	case 0:
		return rapid.Bool().Draw(t, label)
	case 1:
		return int(rapid.Int32().Draw(t, label))
	case 2:
		return rapid.Int64().Draw(t, label)
	case 3:
		return rapid.Float32().Filter(func(x float32) bool { return !math.IsNaN(float64(x)) }).Draw(t, label)
	case 4:
		return rapid.Float64().Filter(func(x float64) bool { return !math.IsNaN(x) }).Draw(t, label)
	case 5:
		return rapid.String().Draw(t, label)
	case 6:
		return rapid.SliceOfN(rapid.Byte(), 0, 40).Draw(t, label)
	case 7:
		return time.UnixMilli(rapid.Int64Range(-1e14, 1e14).Draw(t, label)).UTC()
	case 8:
		return time.UnixMicro(rapid.Int64Range(-1e17, 1e17).Draw(t, label)).UTC()
	case 9:
		return rapid.SampledFrom([]string{"A", "B", "C"}).Draw(t, label)
	case 10:
		return [3]byte{rapid.Byte().Draw(t, label), 1, 2}
	default:
		return []any{rapid.Int64().Draw(t, label)}
	}
}

// TestFlatDecodeMatchesHamba decodes random records of scalar fields,
// written with one schema and read with another (a subset of its fields,
// reordered, or one that needs resolution), both with the flat decoder and
// through hamba/avro, whole and corrupted: both must succeed or fail alike
// and produce equal records.
func TestFlatDecodeMatchesHamba(t *testing.T) {
	flatBuilt := 0
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 8).Draw(t, "fields")
		fields := make([]genField, n)
		types := make([]string, n)
		for i := range fields {
			fields[i] = genField{
				name:     fmt.Sprintf("f%d", i),
				kind:     rapid.IntRange(0, len(flatKinds)-1).Draw(t, "kind"),
				nullable: rapid.IntRange(0, 2).Draw(t, "nullable"),
			}
			types[i] = fields[i].avroType(i)
		}
		writerText := recordJSON(fields, types, "")

		// The reader: none, or some of the writer's fields in a random
		// order, possibly with a field to default or a type to promote.
		readerText := ""
		if rapid.Bool().Draw(t, "reader") {
			perm := rapid.Permutation(fields).Draw(t, "order")
			var rf []genField
			var rt []string
			for _, f := range perm {
				if rapid.Bool().Draw(t, "keep-"+f.name) {
					i := 0
					fmt.Sscanf(f.name, "f%d", &i)
					typ := types[i]
					if f.kind == 1 && f.nullable == 0 && rapid.IntRange(0, 4).Draw(t, "promote") == 0 {
						typ = `"long"`
					}
					rf = append(rf, f)
					rt = append(rt, typ)
				}
			}
			extra := ""
			if rapid.IntRange(0, 4).Draw(t, "default") == 0 {
				extra = `{"name": "added", "type": "string", "default": "x"}`
			}
			readerText = recordJSON(rf, rt, extra)
		}

		values := map[string]any{}
		for i, f := range fields {
			values[f.name] = genValue(t, f, i)
		}
		writer := avro.MustParse(writerText)
		body, err := avro.Marshal(writer, values)
		if err != nil {
			t.Fatalf("encoding %v under %s: %v", values, writerText, err)
		}

		var reader avro.Schema
		if readerText != "" {
			reader = avro.MustParse(readerText)
		}
		d := NewDecoder(nil, reader)
		e := d.build(1, sr.Schema{Schema: writerText, Type: sr.TypeAvro})
		if e.err != nil {
			t.Fatalf("writer %s, reader %s: %v", writerText, readerText, e.err)
		}
		if e.flat == nil {
			return // nothing to compare: hamba/avro decodes it
		}
		flatBuilt++
		generic := *e // as build makes it when the flat decoder does not apply
		generic.flat, generic.norm = nil, newNormalizer(d.api, e.schema, false)

		check := func(label string, body []byte) {
			got, gotErr := d.decode(e, body)
			want, wantErr := d.decode(&generic, body)
			if (gotErr == nil) != (wantErr == nil) {
				t.Fatalf("%s: writer %s reader %s body %x: flat error %v, hamba error %v", label, writerText, readerText, body, gotErr, wantErr)
			}
			if gotErr != nil {
				return
			}
			if !sameRecord(got, want) {
				t.Fatalf("%s: writer %s reader %s: flat %#v, hamba %#v", label, writerText, readerText, got, want)
			}
			for k, v := range got {
				if b, ok := v.([]byte); ok && cap(b) != len(b) {
					t.Fatalf("%s: field %s: []byte with spare capacity %d > %d", label, k, cap(b), len(b))
				}
			}
			if d.Width() == 0 {
				return // DecodeValues gives maps
			}
			// Decoded into values, the record is the same, field by field.
			vals := make([]any, d.Width())
			for i := range vals {
				vals[i] = "left from an earlier record"
			}
			if err := e.flat.decodeValues(body, vals); err != nil {
				t.Fatalf("%s: writer %s reader %s: values: %v, map decoded", label, writerText, readerText, err)
			}
			byName := map[string]any{}
			for i, name := range d.names {
				byName[name] = vals[i]
			}
			if !sameRecord(byName, want) {
				t.Fatalf("%s: writer %s reader %s: values %#v, hamba %#v", label, writerText, readerText, byName, want)
			}
		}
		check("whole", body)
		if len(body) > 0 {
			check("truncated", body[:rapid.IntRange(0, len(body)-1).Draw(t, "cut")])
			bad := append([]byte(nil), body...)
			bad[rapid.IntRange(0, len(bad)-1).Draw(t, "at")] = rapid.Byte().Draw(t, "byte")
			check("corrupted", bad)
		}
	})
	if flatBuilt == 0 {
		t.Fatal("no generated schema took the flat decoder")
	}
}

// TestFlatDecoderTakesEvents: the flat decoder serves the events
// projections usually read, and leaves to hamba/avro what needs
// resolution.
func TestFlatDecoderTakesEvents(t *testing.T) {
	demo, err := fixtures()
	if err != nil {
		t.Fatal(err)
	}
	v1, v2 := demo["account_event"], demo["account_event_v2"]
	for _, tc := range []struct {
		name           string
		writer, reader string
		flat           bool
	}{
		{"same schema", v1, v1, true},
		{"no reader", v1, "", true},
		{"writer adds a field", v2, v1, true},
		{"reader adds a field with a default", v1, v2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reader avro.Schema
			if tc.reader != "" {
				reader = parse(t, tc.reader)
			}
			e := NewDecoder(nil, reader).build(1, sr.Schema{Schema: tc.writer, Type: sr.TypeAvro})
			if e.err != nil {
				t.Fatal(e.err)
			}
			if got := e.flat != nil; got != tc.flat {
				t.Errorf("flat decoder built: %v, want %v", got, tc.flat)
			}
		})
	}
}

// sameRecord is reflect.DeepEqual for decoded records, NaN equal to NaN.
func sameRecord(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		y, ok := b[k]
		if !ok || reflect.TypeOf(x) != reflect.TypeOf(y) {
			return false
		}
		switch x := x.(type) {
		case float32:
			if math.IsNaN(float64(x)) && math.IsNaN(float64(y.(float32))) {
				continue
			}
		case float64:
			if math.IsNaN(x) && math.IsNaN(y.(float64)) {
				continue
			}
		}
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

// TestFlatDecodeErrorNamesField: a bad union branch in a field, read or
// skipped, fails the value with the field's name.
func TestFlatDecodeErrorNamesField(t *testing.T) {
	writer := `{"type": "record", "name": "R", "fields": [
		{"name": "id", "type": "string"},
		{"name": "note", "type": ["null", "string"]}]}`
	for _, tc := range []struct{ name, reader string }{
		{"read", writer},
		{"skipped", `{"type": "record", "name": "R", "fields": [{"name": "id", "type": "string"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDecoder(nil, parse(t, tc.reader))
			e := d.build(1, sr.Schema{Schema: writer, Type: sr.TypeAvro})
			if e.err != nil || e.flat == nil {
				t.Fatalf("entry: err %v, flat %v", e.err, e.flat != nil)
			}
			// id "a", then union index 2 (zig-zag 4): no such branch.
			_, err := d.decode(e, []byte{2, 'a', 4})
			if err == nil || !errors.Is(err, ErrUndecodable) || !strings.Contains(err.Error(), "field note") {
				t.Fatalf("error = %v, want ErrUndecodable naming field note", err)
			}
		})
	}
}

// TestInternedStrings: a string field with few distinct values decodes
// without allocating, one with many still decodes each value right once it
// is no longer interned, and decoders sharing the schema may run at once.
func TestInternedStrings(t *testing.T) {
	writer := avro.MustParse(`{"type": "record", "name": "R", "fields": [
		{"name": "type", "type": "string"},
		{"name": "id", "type": "string"},
		{"name": "ok", "type": "boolean"}]}`)
	fr := newFlatRecord(writer, nil)
	if fr == nil {
		t.Fatal("no flat decoder for a record of strings and a boolean")
	}
	encode := func(typ, id string) []byte {
		body, err := avro.Marshal(writer, map[string]any{"type": typ, "id": id, "ok": true})
		if err != nil {
			t.Fatal(err)
		}
		return body
	}
	types := []string{"Opened", "Deposited", "Withdrawn", "Closed"}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			vals := make([]any, 3)
			for i := range 500 {
				typ, id := types[(i+g)%len(types)], fmt.Sprintf("account-%d-%d", g, i)
				if err := fr.decodeValues(encode(typ, id), vals); err != nil {
					t.Errorf("record %d: %v", i, err)
					return
				}
				if vals[0] != typ || vals[1] != id || vals[2] != true {
					t.Errorf("record %d: decoded %v, want [%s %s true]", i, vals, typ, id)
					return
				}
			}
		})
	}
	wg.Wait()
	if fr.fields[1].intern.vals.Load() != nil {
		t.Error("a field with 2,000 distinct values is still interned")
	}

	// The id field no longer looks its values up; the type field hands out
	// its boxed values and a boolean boxes without allocating.
	body := encode("Deposited", "")
	vals := make([]any, 3)
	if allocs := testing.AllocsPerRun(100, func() {
		if err := fr.decodeValues(body, vals); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("decoding an interned type and an empty id: %.0f allocations, want 0", allocs)
	}
	if vals[0] != "Deposited" {
		t.Errorf("type decoded as %v", vals[0])
	}
}

// FuzzFlatMatchesHamba decodes arbitrary bytes under a record of every
// scalar the flat decoder reads or skips, with the flat decoder and
// through hamba/avro: both must succeed or fail alike, with equal records
// (varints too long, negative or huge lengths, invalid booleans and union
// indexes, truncated and trailing bytes).
func FuzzFlatMatchesHamba(f *testing.F) {
	writerText := `{"type": "record", "name": "R", "fields": [
		{"name": "b", "type": "boolean"},
		{"name": "i", "type": "int"},
		{"name": "l", "type": "long"},
		{"name": "f", "type": "float"},
		{"name": "d", "type": "double"},
		{"name": "s", "type": "string"},
		{"name": "y", "type": "bytes"},
		{"name": "tm", "type": {"type": "long", "logicalType": "timestamp-millis"}},
		{"name": "tu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
		{"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
		{"name": "x", "type": {"type": "fixed", "name": "X", "size": 3}},
		{"name": "ns", "type": ["null", "string"]},
		{"name": "nl", "type": ["long", "null"]},
		{"name": "skipped", "type": "string"},
		{"name": "skippedInt", "type": "int"}]}`
	reader := avro.MustParse(`{"type": "record", "name": "R", "fields": [
		{"name": "nl", "type": ["long", "null"]},
		{"name": "b", "type": "boolean"}, {"name": "i", "type": "int"}, {"name": "l", "type": "long"},
		{"name": "f", "type": "float"}, {"name": "d", "type": "double"}, {"name": "s", "type": "string"},
		{"name": "y", "type": "bytes"},
		{"name": "tm", "type": {"type": "long", "logicalType": "timestamp-millis"}},
		{"name": "tu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
		{"name": "ns", "type": ["null", "string"]}]}`)
	d := NewDecoder(nil, reader)
	e := d.build(1, sr.Schema{Schema: writerText, Type: sr.TypeAvro})
	if e.err != nil || e.flat == nil {
		f.Fatalf("flat decoder not built: %v", e.err)
	}
	generic := *e
	generic.flat, generic.norm = nil, newNormalizer(d.api, e.schema, false)

	writer := avro.MustParse(writerText)
	for _, rec := range []map[string]any{
		{"b": true, "i": -5, "l": int64(1) << 40, "f": float32(1.5), "d": -2.25, "s": "Deposited", "y": []byte{1, 2},
			"tm": time.UnixMilli(1700000000000).UTC(), "tu": time.UnixMicro(-5).UTC(), "e": "B", "x": [3]byte{1, 2, 3},
			"ns": nil, "nl": int64(7), "skipped": "gone", "skippedInt": 300},
		{"b": false, "i": 0, "l": int64(0), "f": float32(0), "d": 0.0, "s": "", "y": []byte{},
			"tm": time.UnixMilli(0).UTC(), "tu": time.UnixMicro(0).UTC(), "e": "A", "x": [3]byte{},
			"ns": "owner", "nl": nil, "skipped": "", "skippedInt": -1},
	} {
		body, err := avro.Marshal(writer, rec)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(body)
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{2})

	f.Fuzz(func(t *testing.T, body []byte) {
		got, gotErr := d.decode(e, body)
		want, wantErr := d.decode(&generic, body)
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("body %x: flat error %v, hamba error %v", body, gotErr, wantErr)
		}
		if gotErr == nil && !sameRecord(got, want) {
			t.Fatalf("body %x: flat %#v, hamba %#v", body, got, want)
		}
		vals := make([]any, d.Width())
		if err := e.flat.decodeValues(body, vals); (err == nil) != (gotErr == nil) {
			t.Fatalf("body %x: into values error %v, into a map error %v", body, err, gotErr)
		}
	})
}
