package repair

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/projector-dev/projector/projection"
)

// Errors from decoding never wrap the json package's errors: an empty body
// would otherwise surface as io.EOF and look like a network failure.

// decodeValue parses data, exactly one JSON value, into v with UseNumber.
func decodeValue(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("no JSON value")
		}
		return fmt.Errorf("invalid JSON: %v", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return errors.New("invalid JSON: data after the value")
	}
	return nil
}

// decodeObject parses a JSON object into its members, undecoded. A JSON null
// gives a nil map; anything else that is not an object is an error.
func decodeObject(data []byte) (map[string]json.RawMessage, error) {
	var raw json.RawMessage
	if err := decodeValue(data, &raw); err != nil {
		return nil, err
	}
	switch k := kindOf(raw); k {
	case '{':
		var m map[string]json.RawMessage
		if err := decodeValue(raw, &m); err != nil {
			return nil, err
		}
		return m, nil
	case 'n':
		return nil, nil
	default:
		return nil, fmt.Errorf("want a JSON object, got %s", kindName(k))
	}
}

// kindOf returns the first byte of a JSON value: '{', '[', '"', 'n', 't',
// 'f', or '0' for a number.
func kindOf(raw json.RawMessage) byte {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return 0
	}
	switch c := raw[0]; c {
	case '{', '[', '"', 'n', 't', 'f':
		return c
	}
	return '0'
}

func kindName(k byte) string {
	switch k {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case '0':
		return "a number"
	}
	return "nothing"
}

// decodeState turns a JSON object into a snapshot row: scalars become int64,
// float64, bool, string or nil; objects and arrays stay JSON text.
func decodeState(data []byte) (projection.Row, error) {
	m, err := decodeObject(data)
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errors.New("want a JSON object, got null")
	}
	row := make(projection.Row, len(m))
	for name, raw := range m {
		switch kindOf(raw) {
		case '{', '[':
			var b bytes.Buffer
			if err := json.Compact(&b, raw); err != nil {
				return nil, fmt.Errorf("%s: invalid JSON: %v", name, err)
			}
			row[name] = b.String()
		default:
			v, err := decodeAny(raw)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", name, err)
			}
			row[name] = v
		}
	}
	return row, nil
}

// decodeFields turns a JSON object into event fields, all the way down. A
// JSON null gives nil fields (a tombstone).
func decodeFields(data []byte) (map[string]any, error) {
	m, err := decodeObject(data)
	if err != nil || m == nil {
		return nil, err
	}
	fields := make(map[string]any, len(m))
	for name, raw := range m {
		v, err := decodeAny(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", name, err)
		}
		fields[name] = v
	}
	return fields, nil
}

// decodeAny decodes one JSON value with numbers as int64 or float64.
func decodeAny(raw json.RawMessage) (any, error) {
	var v any
	if err := decodeValue(raw, &v); err != nil {
		return nil, err
	}
	return convertNumbers(v)
}

func convertNumbers(v any) (any, error) {
	switch x := v.(type) {
	case json.Number:
		return number(x)
	case map[string]any:
		for k, e := range x {
			c, err := convertNumbers(e)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", k, err)
			}
			x[k] = c
		}
	case []any:
		for i, e := range x {
			c, err := convertNumbers(e)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %v", i, err)
			}
			x[i] = c
		}
	}
	return v, nil
}

// maxExactInt is the largest magnitude below which every integer is exactly
// a float64.
const maxExactInt = 1 << 53

// number converts a JSON number: int64 when it is an integer that fits, or
// when it is written as a float with an integral value of exact magnitude
// (1.0, 1e3); float64 otherwise.
func number(n json.Number) (any, error) {
	if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		return i, nil
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil {
		return nil, fmt.Errorf("number %s does not fit a float64", n)
	}
	if f == math.Trunc(f) && math.Abs(f) <= maxExactInt {
		return int64(f), nil
	}
	return f, nil
}

// decodeVersion decodes an aggregate version: a JSON integer.
func decodeVersion(raw json.RawMessage) (int64, error) {
	if k := kindOf(raw); k != '0' {
		return 0, fmt.Errorf("want an integer, got %s", kindName(k))
	}
	v, err := decodeAny(raw)
	if err != nil {
		return 0, err
	}
	i, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("want an integer, got %s", bytes.TrimSpace(raw))
	}
	return i, nil
}
