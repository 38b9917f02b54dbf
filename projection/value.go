package projection

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/projector-dev/projector/internal/avrojson"
)

var (
	identRe     = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	qualifiedRe = regexp.MustCompile(`^([a-z_][a-z0-9_]{0,62}\.)?[a-z_][a-z0-9_]{0,62}$`)
)

func kindOf(pgType string) Kind {
	switch pgType {
	case "text", "timestamptz", "bigint", "integer", "double precision", "boolean":
		// the common spellings, without trimming
	default:
		// pg_catalog is where the built-in types live: naming it changes
		// nothing.
		pgType = strings.TrimPrefix(strings.TrimSpace(pgType), "pg_catalog.")
	}
	switch pgType {
	case "smallint", "integer", "int", "int2", "int4", "int8", "bigint":
		return KindInt
	case "real", "float", "float4", "float8", "double precision":
		return KindFloat
	case "boolean", "bool":
		return KindBool
	}
	return KindText
}

// Convert turns a decoded Avro value into the Go value this column holds
// (see Row), following the mapping of docs/types.md: an array into an
// array column becomes an array literal of elements converted as the
// element type's, a record, map or array into json or jsonb JSON text, a
// decimal exact text. It fails with a message naming the column when the
// value does not fit, including integers outside the column type's range.
func (c Column) Convert(v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	if raw, ok := v.(json.RawMessage); ok {
		var err error
		if v, err = c.fromJSON(raw); v == nil || err != nil {
			return nil, err
		}
	}
	switch c.Kind() {
	case KindInt:
		if n, ok := toInt(v); ok {
			if lim := intLimit(c.Type); n > lim || n < -lim-1 {
				return nil, fmt.Errorf("column %s (%s): %d is out of range", c.Name, c.Type, n)
			}
			if _, same := v.(int64); same {
				return v, nil // boxed already: no allocation
			}
			return n, nil
		}
	case KindFloat:
		switch x := v.(type) {
		case float64:
			return v, nil
		case float32:
			return float64(x), nil
		}
		if n, ok := toInt(v); ok {
			return float64(n), nil
		}
	case KindBool:
		if b, ok := v.(bool); ok {
			return b, nil
		}
	case KindText:
		return c.text(v)
	}
	return nil, fmt.Errorf("column %s (%s): cannot hold %T value %v", c.Name, c.Type, v, v)
}

// fromJSON takes the value of a union of several branches, which the
// engine decodes as JSON (see schemas.UnionsAsJSON), for a column that is
// not json or jsonb: a string, number or boolean branch fills it as that
// branch's value would (a number stays exact text for text columns), any
// other is its JSON text.
func (c Column) fromJSON(raw json.RawMessage) (any, error) {
	switch typ := strings.TrimPrefix(c.Type, "pg_catalog."); {
	case typ == "json" || typ == "jsonb":
		return string(raw), nil
	case len(raw) == 0:
		return nil, nil
	}
	switch raw[0] {
	case 'n':
		return nil, nil
	case 't', 'f':
		return raw[0] == 't', nil
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("column %s (%s): %w", c.Name, c.Type, err)
		}
		return s, nil
	case '{', '[':
		return string(raw), nil
	}
	switch c.Kind() {
	case KindInt:
		if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
			return n, nil
		}
	case KindFloat:
		if f, err := strconv.ParseFloat(string(raw), 64); err == nil {
			return f, nil
		}
	}
	return string(raw), nil
}

func toInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case int32:
		return int64(x), true
	case int:
		return int64(x), true
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<62 {
			return int64(x), true
		}
	case float32:
		if f := float64(x); f == math.Trunc(f) && math.Abs(f) < 1<<62 {
			return int64(f), true
		}
	case string:
		if n, err := strconv.ParseInt(x, 10, 64); err == nil {
			return n, true
		}
	}
	return 0, false
}

// intLimit is the largest value of an integer column type.
func intLimit(pgType string) int64 {
	switch strings.TrimPrefix(pgType, "pg_catalog.") {
	case "smallint", "int2":
		return math.MaxInt16
	case "integer", "int", "int4":
		return math.MaxInt32
	}
	return math.MaxInt64
}

func (c Column) text(v any) (any, error) {
	if _, ok := v.(string); ok {
		return v, nil // boxed already: no allocation
	}
	typ := strings.TrimPrefix(c.Type, "pg_catalog.")
	if elem, ok := strings.CutSuffix(typ, "[]"); ok {
		if a, ok := v.([]any); ok {
			return c.arrayText(Column{Name: c.Name, Type: elem}, a)
		}
	}
	switch typ {
	case "json", "jsonb":
		// A string is JSON text already (see above); anything else is
		// rendered.
		b, err := avrojson.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("column %s (%s): cannot hold %T value as JSON: %w", c.Name, c.Type, v, err)
		}
		return string(b), nil
	case "date":
		if t, ok := v.(time.Time); ok {
			return dateText(t), nil
		}
	}
	switch x := v.(type) {
	case []byte:
		if typ == "bytea" {
			return `\x` + hex.EncodeToString(x), nil
		}
		return string(x), nil
	case time.Time:
		if isTimestamptz(typ) {
			return x.UTC().Format(time.RFC3339Nano), nil
		}
		return avrojson.Timestamp(x), nil
	case time.Duration:
		return avrojson.Clock(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case int32:
		return strconv.FormatInt(int64(x), 10), nil
	case int:
		return strconv.Itoa(x), nil
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), nil
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32), nil
	case bool:
		return strconv.FormatBool(x), nil
	case *big.Rat:
		return decimalText(typ, x), nil
	case json.RawMessage:
		return string(x), nil
	case fmt.Stringer:
		return x.String(), nil
	}
	if b, ok := avrojson.FixedBytes(v); ok {
		if typ == "bytea" {
			return `\x` + hex.EncodeToString(b), nil
		}
		return string(b), nil
	}
	b, err := avrojson.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("column %s (%s): cannot hold %T value: %w", c.Name, c.Type, v, err)
	}
	return string(b), nil
}

// decimalText renders r for a column of type typ: rounded to its scale
// as Postgres rounds it (half away from zero) for numeric(p,s), so that
// a row held in memory has the value the table has; exactly otherwise.
func decimalText(typ string, r *big.Rat) string {
	if rest, ok := strings.CutPrefix(typ, "numeric("); ok {
		if _, scale, ok := strings.Cut(strings.TrimSuffix(rest, ")"), ","); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(scale)); err == nil && n >= 0 {
				return r.FloatString(n)
			}
		}
		return r.FloatString(0) // numeric(p): scale 0
	}
	return avrojson.Decimal(r)
}

func isTimestamptz(typ string) bool {
	return typ == "timestamptz" || strings.HasPrefix(typ, "timestamp with time zone") ||
		(strings.HasPrefix(typ, "timestamp(") && strings.HasSuffix(typ, "with time zone"))
}

// dateText renders the day of t as Postgres reads a date, years before 1
// as BC.
func dateText(t time.Time) string {
	if y := t.Year(); y < 1 {
		return fmt.Sprintf("%04d-%02d-%02d BC", 1-y, t.Month(), t.Day())
	}
	return t.Format("2006-01-02")
}

// arrayText renders a as a Postgres array literal of elem values: each
// element converted as a column of type elem would convert it (so
// integers are range-checked) and quoted, NULL for nil, and a nested
// array as a sub-array (Postgres names int[][] int[]).
func (c Column) arrayText(elem Column, a []any) (string, error) {
	b := make([]byte, 0, 2+8*len(a))
	var err error
	if b, err = c.appendArray(b, elem, a); err != nil {
		return "", err
	}
	return string(b), nil
}

func (c Column) appendArray(b []byte, elem Column, a []any) ([]byte, error) {
	b = append(b, '{')
	for i, e := range a {
		if i > 0 {
			b = append(b, ',')
		}
		if e == nil {
			b = append(b, "NULL"...)
			continue
		}
		if sub, ok := e.([]any); ok {
			var err error
			if b, err = c.appendArray(b, elem, sub); err != nil {
				return nil, err
			}
			continue
		}
		conv, err := elem.Convert(e)
		if err != nil {
			return nil, fmt.Errorf("column %s (%s): element %d: %w", c.Name, c.Type, i, err)
		}
		t, err := elem.EncodeText(conv)
		if err != nil {
			return nil, fmt.Errorf("column %s (%s): element %d: %w", c.Name, c.Type, i, err)
		}
		b = append(b, '"')
		for j := 0; j < len(*t); j++ {
			if ch := (*t)[j]; ch == '"' || ch == '\\' {
				b = append(b, '\\')
			}
			b = append(b, (*t)[j])
		}
		b = append(b, '"')
	}
	return append(b, '}'), nil
}

// EncodeText renders a Row value of this column in Postgres text form for
// a set-based write; nil is NULL.
func (c Column) EncodeText(v any) (*string, error) {
	var s string
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		s = x
	case int64:
		s = strconv.FormatInt(x, 10)
	case float64:
		switch {
		case math.IsNaN(x):
			s = "NaN"
		case math.IsInf(x, 1):
			s = "Infinity"
		case math.IsInf(x, -1):
			s = "-Infinity"
		default:
			s = strconv.FormatFloat(x, 'g', -1, 64)
		}
	case bool:
		s = strconv.FormatBool(x)
	default:
		// Convert only returns nil, int64, float64, bool or string.
		conv, err := c.Convert(v)
		if err != nil {
			return nil, err
		}
		return c.EncodeText(conv)
	}
	return &s, nil
}

// DecodeText parses a value read back from Postgres in text form.
func (c Column) DecodeText(s *string) (any, error) {
	if s == nil {
		return nil, nil
	}
	switch c.Kind() {
	case KindInt:
		n, err := strconv.ParseInt(*s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("column %s: read %q: %w", c.Name, *s, err)
		}
		return n, nil
	case KindFloat:
		f, err := strconv.ParseFloat(*s, 64)
		if err != nil {
			return nil, fmt.Errorf("column %s: read %q: %w", c.Name, *s, err)
		}
		return f, nil
	case KindBool:
		return *s == "t" || *s == "true", nil
	}
	return *s, nil
}

// Stored returns v as reading it back from this column gives it: the Go
// type of the column's kind (see Row), a real rounded to single precision.
// Text values keep the text they were written in; Postgres may render some
// types (timestamptz, numeric, jsonb) differently when they are read, with
// the same meaning.
func (c Column) Stored(v any) (any, error) {
	single := c.Type == "real" || c.Type == "float4"
	switch x := v.(type) {
	case nil:
		return nil, nil
	case int64:
		if c.Kind() == KindInt {
			return x, nil
		}
	case float64:
		if c.Kind() == KindFloat && !single {
			return x, nil
		}
	case bool:
		if c.Kind() == KindBool {
			return x, nil
		}
	case string:
		if c.Kind() == KindText {
			return x, nil
		}
	}
	t, err := c.EncodeText(v)
	if err != nil || t == nil {
		return nil, err
	}
	if single {
		f, err := strconv.ParseFloat(*t, 32)
		if err != nil {
			return nil, fmt.Errorf("column %s: %q: %w", c.Name, *t, err)
		}
		return strconv.ParseFloat(strconv.FormatFloat(f, 'g', -1, 32), 64)
	}
	return c.DecodeText(t)
}
