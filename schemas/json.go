package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/big"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/hamba/avro/v2"
)

// JSONError is a JSON value that does not fit its schema: Path names the
// field ("amount", "address.city", "items[2]"; empty for the value itself)
// and Msg says what was wanted and what was found.
type JSONError struct {
	Path string
	Msg  string
}

func (e *JSONError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return fmt.Sprintf("field %q: %s", e.Path, e.Msg)
}

// FromJSON converts one JSON document into the Go value AppendWire encodes
// under schema. It reads both Avro's JSON encoding (a union value as
// {"branch": value}, bytes and fixed as strings of code points 0-255) and
// plain JSON: a union value as itself, its branch found from the value
// (null, then branches of the value's own JSON type in schema order, then
// the logical types read from strings or numbers); numbers into int, long,
// float and double; timestamps from RFC 3339 strings or from a number in
// the type's unit; a date from "2006-01-02" or days since the epoch;
// time-millis and time-micros from "15:04:05.000" or a number; a decimal
// from a JSON number or a numeric string (other strings are Avro's bytes);
// a uuid from its text. A record's missing field takes the schema's
// default; a field the schema does not have is refused, as a misspelling
// would otherwise be lost silently.
//
// A failure is a *JSONError naming the field.
func FromJSON(schema avro.Schema, data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, &JSONError{Msg: "not JSON: " + err.Error()}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, &JSONError{Msg: "not one JSON value: text follows the first value"}
	}
	return fromJSON(schema, v, "")
}

func fromJSON(s avro.Schema, v any, path string) (any, error) {
	s = deref(s)
	fail := func(format string, args ...any) (any, error) {
		return nil, &JSONError{Path: path, Msg: fmt.Sprintf(format, args...)}
	}
	want := func() (any, error) { return fail("want %s, got %s", describe(s), shown(v)) }
	if v == nil && s.Type() != avro.Null && s.Type() != avro.Union {
		return want()
	}
	logical := ""
	if l, ok := s.(avro.LogicalTypeSchema); ok && l.Logical() != nil {
		logical = string(l.Logical().Type())
	}
	switch t := s.(type) {
	case *avro.PrimitiveSchema:
		switch t.Type() {
		case avro.Null:
			if v != nil {
				return want()
			}
			return nil, nil
		case avro.Boolean:
			if b, ok := v.(bool); ok {
				return b, nil
			}
			return want()
		case avro.Int:
			switch logical {
			case "date":
				if str, ok := v.(string); ok {
					d, err := time.Parse(time.DateOnly, str)
					if err != nil {
						return fail("want a date as YYYY-MM-DD or days since 1970-01-01, got %s", shown(v))
					}
					return d, nil
				}
				n, ok := integer(v, math.MinInt32, math.MaxInt32)
				if !ok {
					return want()
				}
				return time.Unix(n*86400, 0).UTC(), nil
			case "time-millis":
				if d, ok := clock(v); ok {
					return d, nil
				}
				n, ok := integer(v, math.MinInt32, math.MaxInt32)
				if !ok {
					return fail("want a time of day as HH:MM:SS[.fff] or milliseconds, got %s", shown(v))
				}
				return time.Duration(n) * time.Millisecond, nil
			}
			n, ok := integer(v, math.MinInt32, math.MaxInt32)
			if !ok {
				return want()
			}
			return int(n), nil
		case avro.Long:
			switch logical {
			case "timestamp-millis", "timestamp-micros", "local-timestamp-millis", "local-timestamp-micros":
				unit := time.Millisecond
				if strings.HasSuffix(logical, "micros") {
					unit = time.Microsecond
				}
				if str, ok := v.(string); ok {
					ts, err := time.Parse(time.RFC3339Nano, str)
					if err != nil && strings.HasPrefix(logical, "local-") {
						// A local timestamp names no zone; it is encoded as
						// if it were UTC.
						ts, err = time.Parse("2006-01-02T15:04:05.999999999", str)
					}
					if err != nil {
						return fail("want an RFC 3339 time (2006-01-02T15:04:05Z) or a number of %s since the epoch, got %s", unitName(unit), shown(v))
					}
					return ts, nil
				}
				n, ok := integer(v, math.MinInt64, math.MaxInt64)
				if !ok {
					return want()
				}
				if unit == time.Millisecond {
					return time.UnixMilli(n).UTC(), nil
				}
				return time.UnixMicro(n).UTC(), nil
			case "time-micros":
				if d, ok := clock(v); ok {
					return d, nil
				}
				n, ok := integer(v, math.MinInt64, math.MaxInt64)
				if !ok {
					return fail("want a time of day as HH:MM:SS[.ffffff] or microseconds, got %s", shown(v))
				}
				return time.Duration(n) * time.Microsecond, nil
			}
			n, ok := integer(v, math.MinInt64, math.MaxInt64)
			if !ok {
				return want()
			}
			return n, nil
		case avro.Float, avro.Double:
			f, ok := float(v)
			if !ok {
				return want()
			}
			if t.Type() == avro.Float {
				if !math.IsInf(f, 0) && math.Abs(f) > math.MaxFloat32 {
					return fail("want float, got %s: out of range", shown(v))
				}
				return float32(f), nil
			}
			return f, nil
		case avro.String:
			str, ok := v.(string)
			if !ok {
				return want()
			}
			if logical == "uuid" {
				if _, err := uuid.Parse(str); err != nil {
					return fail("want a uuid (8-4-4-4-12 hex digits), got %s", shown(v))
				}
			}
			return str, nil
		case avro.Bytes:
			if logical == "decimal" {
				return decimal(t.Logical().(*avro.DecimalLogicalSchema), v, 0, path)
			}
			str, ok := v.(string)
			if !ok {
				return want()
			}
			b, ok := codePoints(str)
			if !ok {
				return fail("want bytes as a string of code points 0-255 (\\u0000-\\u00ff), got %s", shown(v))
			}
			return b, nil
		}
	case *avro.FixedSchema:
		if logical == "decimal" {
			return decimal(t.Logical().(*avro.DecimalLogicalSchema), v, t.Size(), path)
		}
		str, ok := v.(string)
		if !ok {
			return want()
		}
		b, ok := codePoints(str)
		if !ok || len(b) != t.Size() {
			return fail("want %d bytes as a string of code points 0-255, got %s", t.Size(), shown(v))
		}
		if logical == "duration" {
			return avro.LogicalDuration{
				Months:       leUint32(b[0:4]),
				Days:         leUint32(b[4:8]),
				Milliseconds: leUint32(b[8:12]),
			}, nil
		}
		arr := reflect.New(reflect.ArrayOf(t.Size(), reflect.TypeFor[byte]())).Elem()
		reflect.Copy(arr, reflect.ValueOf(b))
		return arr.Interface(), nil
	case *avro.EnumSchema:
		str, ok := v.(string)
		if !ok {
			return want()
		}
		for _, sym := range t.Symbols() {
			if sym == str {
				return str, nil
			}
		}
		return fail("want one of %s (enum %s), got %s", strings.Join(t.Symbols(), ", "), t.FullName(), shown(v))
	case *avro.ArraySchema:
		items, ok := v.([]any)
		if !ok {
			return want()
		}
		out := make([]any, len(items))
		for i, it := range items {
			x, err := fromJSON(t.Items(), it, fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return nil, err
			}
			out[i] = x
		}
		return out, nil
	case *avro.MapSchema:
		m, ok := v.(map[string]any)
		if !ok {
			return want()
		}
		out := make(map[string]any, len(m))
		for k, it := range m {
			x, err := fromJSON(t.Values(), it, join(path, k))
			if err != nil {
				return nil, err
			}
			out[k] = x
		}
		return out, nil
	case *avro.RecordSchema:
		m, ok := v.(map[string]any)
		if !ok {
			return want()
		}
		out := make(map[string]any, len(t.Fields()))
		for _, f := range t.Fields() {
			fv, ok := m[f.Name()]
			if !ok {
				if !f.HasDefault() {
					return nil, &JSONError{Path: join(path, f.Name()), Msg: "missing, and the schema gives it no default"}
				}
				continue // the encoder writes the default
			}
			x, err := fromJSON(f.Type(), fv, join(path, f.Name()))
			if err != nil {
				return nil, err
			}
			out[f.Name()] = x
		}
		if len(m) > len(out) {
			// Every field the event names is in out by now: the rest are
			// not the schema's, reported in order so a message is stable.
			for _, k := range slices.Sorted(maps.Keys(m)) {
				if _, ok := out[k]; !ok {
					return nil, &JSONError{Path: join(path, k), Msg: fmt.Sprintf("not a field of record %s", t.FullName())}
				}
			}
		}
		return out, nil
	case *avro.UnionSchema:
		return union(t, v, path)
	}
	return fail("schema type %s is not supported", s.Type())
}

// union picks the branch of v and returns it tagged, the form hamba/avro
// encodes a union in a map from.
func union(t *avro.UnionSchema, v any, path string) (any, error) {
	if v == nil {
		if _, i := t.Types().Get("null"); i >= 0 {
			return map[string]any{"null": nil}, nil
		}
		return nil, &JSONError{Path: path, Msg: fmt.Sprintf("want %s, got null", describe(t))}
	}
	// Avro's JSON encoding: {"branch": value}, the branch by its full
	// name, its short name, or its type without the logical type.
	if m, ok := v.(map[string]any); ok && len(m) == 1 {
		for k, x := range m {
			for _, br := range t.Types() {
				if !branchNamed(br, k) {
					continue
				}
				out, err := fromJSON(br, x, path)
				if err != nil {
					return nil, err
				}
				return map[string]any{typeName(br): out}, nil
			}
		}
	}
	var firstErr error
	for pass := range 2 {
		for _, br := range t.Types() {
			if br.Type() == avro.Null || natural(br, v) != (pass == 0) {
				continue
			}
			out, err := fromJSON(br, v, path)
			if err == nil {
				return map[string]any{typeName(br): out}, nil
			}
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	// With one candidate branch, its own complaint is the clearest.
	if nonNull(t) == 1 && firstErr != nil {
		return nil, firstErr
	}
	return nil, &JSONError{Path: path, Msg: fmt.Sprintf("want %s, got %s", describe(t), shown(v))}
}

// natural reports whether v's JSON type is br's own (a number for a
// numeric type, a string for a string), not one br reads through its
// logical type.
func natural(br avro.Schema, v any) bool {
	br = deref(br)
	if l, ok := br.(avro.LogicalTypeSchema); ok && l.Logical() != nil && l.Logical().Type() != avro.UUID {
		return false
	}
	switch v.(type) {
	case bool:
		return br.Type() == avro.Boolean
	case json.Number:
		switch br.Type() {
		case avro.Int, avro.Long, avro.Float, avro.Double:
			return true
		}
	case string:
		switch br.Type() {
		case avro.String, avro.Enum, avro.Bytes, avro.Fixed:
			return true
		}
	case []any:
		return br.Type() == avro.Array
	case map[string]any:
		return br.Type() == avro.Record || br.Type() == avro.Map
	}
	return false
}

func branchNamed(br avro.Schema, name string) bool {
	br = deref(br)
	if n, ok := br.(avro.NamedSchema); ok {
		return n.FullName() == name || n.Name() == name
	}
	return string(br.Type()) == name || typeName(br) == name
}

func nonNull(t *avro.UnionSchema) int {
	n := 0
	for _, br := range t.Types() {
		if br.Type() != avro.Null {
			n++
		}
	}
	return n
}

// decimal reads a decimal from a JSON number, a numeric string, or (Avro's
// JSON encoding) a string of code points holding the unscaled two's
// complement bytes. It refuses digits beyond the schema's scale and
// precision rather than round them away.
func decimal(d *avro.DecimalLogicalSchema, v any, size int, path string) (any, error) {
	fail := func(format string, args ...any) (any, error) {
		return nil, &JSONError{Path: path, Msg: fmt.Sprintf(format, args...)}
	}
	var text string
	switch x := v.(type) {
	case json.Number:
		text = string(x)
	case string:
		text = x
	default:
		return fail("want decimal(%d,%d) as a number or a numeric string, got %s", d.Precision(), d.Scale(), shown(v))
	}
	pow := new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(d.Scale())), nil))
	text = strings.TrimSpace(text)
	if !jsonNumber.MatchString(text) {
		s, isStr := v.(string)
		b, cp := codePoints(s)
		if !isStr || !cp || (size > 0 && len(b) != size) || len(b) == 0 {
			return fail("want decimal(%d,%d) as a number or a numeric string, got %s", d.Precision(), d.Scale(), shown(v))
		}
		unscaled := new(big.Int).SetBytes(b)
		if b[0]&0x80 != 0 { // negative in two's complement
			unscaled.Sub(unscaled, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
		}
		if digits := len(new(big.Int).Abs(unscaled).String()); digits > d.Precision() {
			return fail("want decimal(%d,%d), got %d unscaled digits: more than %d", d.Precision(), d.Scale(), digits, d.Precision())
		}
		return new(big.Rat).Quo(new(big.Rat).SetInt(unscaled), pow), nil
	}
	r, ok := rat(text)
	if !ok {
		return fail("want decimal(%d,%d), got %s: out of range", d.Precision(), d.Scale(), shown(v))
	}
	scaled := new(big.Rat).Mul(r, pow)
	if !scaled.IsInt() {
		return fail("want decimal(%d,%d), got %s: more than %d digits after the point", d.Precision(), d.Scale(), shown(v), d.Scale())
	}
	if digits := len(new(big.Int).Abs(scaled.Num()).String()); digits > d.Precision() {
		return fail("want decimal(%d,%d), got %s: more than %d digits", d.Precision(), d.Scale(), shown(v), d.Precision())
	}
	return r, nil
}

// jsonNumber is JSON's grammar of a number.
var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$`)

// maxExponent bounds the exponent of a number read exactly: no value of an
// Avro type needs more, and 1e999999 would take big.Rat a noticeable
// while.
const maxExponent = 1000

// rat reads a JSON number exactly, refusing exponents beyond maxExponent.
func rat(text string) (*big.Rat, bool) {
	if i := strings.IndexAny(text, "eE"); i >= 0 {
		exp, err := strconv.Atoi(text[i+1:])
		if err != nil || exp > maxExponent || exp < -maxExponent {
			return nil, false
		}
	}
	return new(big.Rat).SetString(text)
}

// integer reads a JSON number without a fractional part within [lo, hi].
func integer(v any, lo, hi int64) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil {
		// 1e3 or 10.0 are integers too, when exactly so.
		r, ok := rat(string(n))
		if !ok || !r.IsInt() || !r.Num().IsInt64() {
			return 0, false
		}
		i = r.Num().Int64()
	}
	return i, i >= lo && i <= hi
}

// float reads a JSON number, or "NaN", "Infinity" or "-Infinity", which
// JSON has no numbers for.
func float(v any) (float64, bool) {
	switch x := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		return f, err == nil
	case string:
		switch x {
		case "NaN":
			return math.NaN(), true
		case "Infinity":
			return math.Inf(1), true
		case "-Infinity":
			return math.Inf(-1), true
		}
	}
	return 0, false
}

// clock reads a time of day, "15:04:05" with an optional fraction.
func clock(v any) (time.Duration, bool) {
	s, ok := v.(string)
	if !ok {
		return 0, false
	}
	t, err := time.Parse("15:04:05.999999999", s)
	if err != nil {
		return 0, false
	}
	return time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute +
		time.Duration(t.Second())*time.Second + time.Duration(t.Nanosecond()), true
}

// codePoints is Avro's JSON encoding of bytes: one code point per byte.
func codePoints(s string) ([]byte, bool) {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if r > 255 || r == utf8.RuneError {
			return nil, false
		}
		b = append(b, byte(r))
	}
	return b, true
}

func leUint32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func unitName(d time.Duration) string {
	if d == time.Millisecond {
		return "milliseconds"
	}
	return "microseconds"
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// describe names a schema as an error message wants it: "long",
// "timestamp-millis", "record demo.Account", "one of null, string".
func describe(s avro.Schema) string {
	s = deref(s)
	if l, ok := s.(avro.LogicalTypeSchema); ok && l.Logical() != nil {
		if d, ok := l.Logical().(*avro.DecimalLogicalSchema); ok {
			return fmt.Sprintf("decimal(%d,%d)", d.Precision(), d.Scale())
		}
		return string(l.Logical().Type())
	}
	switch t := s.(type) {
	case *avro.UnionSchema:
		names := make([]string, len(t.Types()))
		for i, br := range t.Types() {
			names[i] = describe(br)
		}
		return "one of " + strings.Join(names, ", ")
	case avro.NamedSchema:
		return string(s.Type()) + " " + t.FullName()
	case *avro.ArraySchema:
		return "an array"
	case *avro.MapSchema:
		return "an object (map)"
	}
	return string(s.Type())
}

// shown renders a JSON value for an error message, cut short when long.
func shown(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case json.Number:
		return string(x)
	case bool:
		return strconv.FormatBool(x)
	case string:
		if len(x) > 60 {
			x = x[:57] + "..."
		}
		return strconv.Quote(x)
	}
	return fmt.Sprint(v)
}
