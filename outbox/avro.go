package outbox

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/schemas"
)

// errUnencodable marks a value that cannot be encoded with its topic's
// latest schema (or a topic without one): retrying it as it is cannot
// succeed, so the row blocks its aggregate until it is retried.
var errUnencodable = errors.New("value cannot be encoded")

// topicSchema is the latest value schema of a topic.
type topicSchema struct {
	id      int
	schema  avro.Schema
	fetched time.Time
}

// schemaCache holds the latest value schema per topic, refreshed after
// schemaTTL or when a value does not fit.
type schemaCache struct {
	reg schemas.Subjects
	mu  sync.Mutex
	m   map[string]*topicSchema
}

const schemaTTL = 5 * time.Minute

func (c *schemaCache) get(ctx context.Context, topic string, fresh bool) (*topicSchema, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ts := c.m[topic]; ts != nil && !fresh && time.Since(ts.fetched) < schemaTTL {
		return ts, nil
	}
	if c.reg == nil {
		return nil, fmt.Errorf("%w: topic %s: the relay has no schema registry", errUnencodable, topic)
	}
	subject := topic + "-value"
	ss, err := c.reg.SchemaByVersion(ctx, subject, -1)
	if err != nil {
		var re *sr.ResponseError
		if errors.As(err, &re) && (re.ErrorCode == sr.ErrSubjectNotFound.Code || re.ErrorCode == sr.ErrVersionNotFound.Code) {
			return nil, fmt.Errorf("%w: no schema registered under %q: %v", errUnencodable, subject, err)
		}
		return nil, fmt.Errorf("latest schema of %q: %w", subject, err) // transient
	}
	s, err := schemas.ReaderSchema(ctx, c.reg, ss.Schema.Schema, subject)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", errUnencodable, subject, err)
	}
	ts := &topicSchema{id: ss.ID, schema: s, fetched: time.Now()}
	if c.m == nil {
		c.m = map[string]*topicSchema{}
	}
	c.m[topic] = ts
	return ts, nil
}

// encode returns the wire-format value of the JSON value js under the
// topic's latest schema. A value that does not fit the cached schema is
// tried once more with a freshly fetched one.
func (c *schemaCache) encode(ctx context.Context, topic string, js []byte) ([]byte, error) {
	var err error
	for _, fresh := range []bool{false, true} {
		var ts *topicSchema
		if ts, err = c.get(ctx, topic, fresh); err != nil {
			return nil, err
		}
		var b []byte
		if b, err = EncodeJSON(ts.id, ts.schema, js); err == nil {
			return b, nil
		}
	}
	return nil, fmt.Errorf("%w: %v", errUnencodable, err)
}

// EncodeJSON returns the Confluent wire format (schema id, then the Avro
// binary encoding) of the JSON value js under schema: js is what Append
// stores for an Event's Value. See Event.Value for how JSON maps to Avro.
func EncodeJSON(id int, schema avro.Schema, js []byte) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(js))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("value is not JSON: %w", err)
	}
	native, err := toAvro(v, schema)
	if err != nil {
		return nil, err
	}
	return schemas.AppendWire(nil, id, schema, native)
}

// toAvro converts v, decoded from JSON with UseNumber (or a schema
// default), into what hamba/avro encodes with s.
func toAvro(v any, s avro.Schema) (any, error) {
	if ref, ok := s.(*avro.RefSchema); ok {
		s = ref.Schema()
	}
	logical := logicalType(s)
	switch s.Type() {
	case avro.Null:
		if v != nil {
			return nil, fmt.Errorf("want null, got %T", v)
		}
		return nil, nil
	case avro.Boolean:
		b, ok := v.(bool)
		if !ok {
			return nil, fmt.Errorf("want boolean, got %T", v)
		}
		return b, nil
	case avro.Int:
		switch logical {
		case avro.Date:
			if str, ok := v.(string); ok {
				if t, err := time.Parse(time.DateOnly, str); err == nil {
					return t, nil
				}
				return parseTime(str)
			}
			n, err := integer(v)
			return time.Unix(n*86400, 0).UTC(), err
		case avro.TimeMillis:
			return duration(v)
		}
		n, err := integer(v)
		if err != nil {
			return nil, err
		}
		if n < math.MinInt32 || n > math.MaxInt32 {
			return nil, fmt.Errorf("%d overflows an Avro int", n)
		}
		return int(n), nil
	case avro.Long:
		switch logical {
		case avro.TimestampMillis, avro.TimestampMicros, avro.LocalTimestampMillis, avro.LocalTimestampMicros:
			if str, ok := v.(string); ok {
				return parseTime(str)
			}
			n, err := integer(v)
			if logical == avro.TimestampMicros || logical == avro.LocalTimestampMicros {
				return time.UnixMicro(n).UTC(), err
			}
			return time.UnixMilli(n).UTC(), err
		case avro.TimeMicros:
			return duration(v)
		}
		return integer(v)
	case avro.Float:
		f, err := float(v)
		return float32(f), err
	case avro.Double:
		return float(v)
	case avro.String, avro.Enum:
		str, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("want string, got %T", v)
		}
		return str, nil
	case avro.Bytes, avro.Fixed:
		if logical == avro.Decimal {
			return decimal(v)
		}
		b, err := byteString(v)
		if err != nil {
			return nil, err
		}
		fs, ok := s.(*avro.FixedSchema)
		if !ok {
			return b, nil
		}
		if len(b) != fs.Size() {
			return nil, fmt.Errorf("fixed %s: %d bytes, want %d", fs.FullName(), len(b), fs.Size())
		}
		arr := reflect.New(reflect.ArrayOf(fs.Size(), reflect.TypeFor[byte]())).Elem()
		reflect.Copy(arr, reflect.ValueOf(b))
		return arr.Interface(), nil
	case avro.Array:
		items, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("want array, got %T", v)
		}
		out := make([]any, len(items))
		for i, item := range items {
			c, err := toAvro(item, s.(*avro.ArraySchema).Items())
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			out[i] = c
		}
		return out, nil
	case avro.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("want object, got %T", v)
		}
		out := make(map[string]any, len(m))
		for k, item := range m {
			c, err := toAvro(item, s.(*avro.MapSchema).Values())
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			out[k] = c
		}
		return out, nil
	case avro.Record:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("record %s: want object, got %T", s.(*avro.RecordSchema).FullName(), v)
		}
		fields := s.(*avro.RecordSchema).Fields()
		out := make(map[string]any, len(fields))
		for _, f := range fields {
			item, ok := m[f.Name()]
			if !ok {
				if !f.HasDefault() {
					return nil, fmt.Errorf("field %s is missing and has no default", f.Name())
				}
				item = f.Default()
			}
			c, err := toAvro(item, f.Type())
			if err != nil {
				return nil, fmt.Errorf("field %s: %w", f.Name(), err)
			}
			out[f.Name()] = c
		}
		return out, nil
	case avro.Union:
		return union(v, s.(*avro.UnionSchema))
	}
	return nil, fmt.Errorf("unsupported Avro type %s", s.Type())
}

// union returns v as hamba's union map {branch name: value}, or nil for
// null. An object with a single key naming a branch is that branch (the
// Avro JSON encoding); otherwise the first branch v converts to wins.
func union(v any, u *avro.UnionSchema) (any, error) {
	if v == nil {
		for _, t := range u.Types() {
			if t.Type() == avro.Null {
				return nil, nil
			}
		}
		return nil, errors.New("null is not in the union")
	}
	if m, ok := v.(map[string]any); ok && len(m) == 1 {
		for k, inner := range m {
			if t, _ := u.Types().Get(k); t != nil {
				c, err := toAvro(inner, t)
				if err != nil {
					return nil, fmt.Errorf("union branch %s: %w", k, err)
				}
				return map[string]any{k: c}, nil
			}
		}
	}
	var errs []error
	for _, t := range u.Types() {
		if t.Type() == avro.Null {
			continue
		}
		c, err := toAvro(v, t)
		if err == nil {
			return map[string]any{typeName(t): c}, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("fits no branch of the union: %w", errors.Join(errs...))
}

// typeName is the name hamba/avro knows a union branch by.
func typeName(s avro.Schema) string {
	if ref, ok := s.(*avro.RefSchema); ok {
		s = ref.Schema()
	}
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	if lt := logicalType(s); lt != "" {
		return string(s.Type()) + "." + string(lt)
	}
	return string(s.Type())
}

func logicalType(s avro.Schema) avro.LogicalType {
	if ls, ok := s.(avro.LogicalTypeSchema); ok && ls.Logical() != nil {
		return ls.Logical().Type()
	}
	return ""
}

func integer(v any) (int64, error) {
	switch n := v.(type) {
	case json.Number:
		if i, err := n.Int64(); err == nil {
			return i, nil
		}
		f, err := n.Float64()
		if err != nil || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
			return 0, fmt.Errorf("%s is not an integer", n)
		}
		return int64(f), nil
	case int:
		return int64(n), nil
	case int32:
		return int64(n), nil
	case int64:
		return n, nil
	case float64:
		if n != math.Trunc(n) {
			return 0, fmt.Errorf("%v is not an integer", n)
		}
		return int64(n), nil
	}
	return 0, fmt.Errorf("want integer, got %T", v)
}

func float(v any) (float64, error) {
	switch n := v.(type) {
	case json.Number:
		return n.Float64()
	case float64:
		return n, nil
	case float32:
		return float64(n), nil
	case int, int32, int64:
		i, _ := integer(n)
		return float64(i), nil
	}
	return 0, fmt.Errorf("want number, got %T", v)
}

// duration reads a time of day: a number of nanoseconds (a time.Duration
// marshalled by encoding/json) or a Go duration string.
func duration(v any) (time.Duration, error) {
	if str, ok := v.(string); ok {
		return time.ParseDuration(str)
	}
	n, err := integer(v)
	return time.Duration(n), err
}

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return t, fmt.Errorf("want an RFC 3339 time: %w", err)
	}
	return t, nil
}

func decimal(v any) (*big.Rat, error) {
	var text string
	switch n := v.(type) {
	case string:
		text = n
	case json.Number:
		text = n.String()
	case float64:
		text = strconv.FormatFloat(n, 'f', -1, 64)
	default:
		return nil, fmt.Errorf("want a decimal number or string, got %T", v)
	}
	r, ok := new(big.Rat).SetString(text)
	if !ok {
		return nil, fmt.Errorf("%q is not a decimal", text)
	}
	return r, nil
}

// byteString reads bytes: base64 (how encoding/json marshals a []byte), or
// a schema default.
func byteString(v any) ([]byte, error) {
	switch b := v.(type) {
	case []byte:
		return b, nil
	case string:
		out, err := base64.StdEncoding.DecodeString(b)
		if err != nil {
			return nil, fmt.Errorf("bytes must be base64 (as encoding/json writes a []byte): %w", err)
		}
		return out, nil
	}
	return nil, fmt.Errorf("want base64 bytes, got %T", v)
}
