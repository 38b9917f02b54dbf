// Package avrojson renders decoded Avro values, in the Go types
// schemas.Decoder gives them, as JSON and as the text forms Postgres reads
// them in (an exact decimal, a time of day). It owns no I/O and no
// decisions about columns: projection picks the form a column takes.
package avrojson

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/hamba/avro/v2"
)

// Marshal renders v as JSON: records and maps as objects (keys sorted),
// arrays as arrays, bytes and fixed as base64 strings, decimals as exact
// numbers, timestamps as RFC 3339 strings (a local timestamp without an
// offset), times of day as "15:04:05.000000" strings and a union's value
// as the value of its branch. A NaN or infinite float has no JSON form and
// fails.
func Marshal(v any) ([]byte, error) {
	return appendValue(nil, v)
}

func appendValue(b []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		return strconv.AppendBool(b, x), nil
	case int:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int32:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int64:
		return strconv.AppendInt(b, x, 10), nil
	case float32:
		return appendFloat(b, float64(x), 32)
	case float64:
		return appendFloat(b, x, 64)
	case string:
		return AppendString(b, x), nil
	case []byte:
		return AppendString(b, base64.StdEncoding.EncodeToString(x)), nil
	case *big.Rat:
		if x == nil {
			return append(b, "null"...), nil
		}
		return append(b, Decimal(x)...), nil
	case time.Time:
		return AppendString(b, Timestamp(x)), nil
	case time.Duration:
		return AppendString(b, Clock(x)), nil
	case json.RawMessage:
		if x == nil {
			return append(b, "null"...), nil
		}
		return append(b, x...), nil
	case avro.LogicalDuration:
		return fmt.Appendf(b, `{"months":%d,"days":%d,"milliseconds":%d}`, x.Months, x.Days, x.Milliseconds), nil
	case []any:
		b = append(b, '[')
		for i, e := range x {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendValue(b, e); err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
		}
		return append(b, ']'), nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys) // the same value, the same text
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendString(b, k)
			b = append(b, ':')
			var err error
			if b, err = appendValue(b, x[k]); err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
		}
		return append(b, '}'), nil
	}
	if raw, ok := FixedBytes(v); ok {
		return AppendString(b, base64.StdEncoding.EncodeToString(raw)), nil
	}
	js, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, js...), nil
}

func appendFloat(b []byte, f float64, bits int) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, fmt.Errorf("%v has no JSON form", f)
	}
	return strconv.AppendFloat(b, f, 'g', -1, bits), nil
}

// AppendString appends s as a JSON string. HTML characters stay as they
// are (encoding/json would escape them), and invalid UTF-8 becomes U+FFFD.
func AppendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, "\ufffd"...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// FixedBytes returns the bytes of an Avro fixed value ([N]byte).
func FixedBytes(v any) ([]byte, bool) {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Array || rv.Type().Elem().Kind() != reflect.Uint8 {
		return nil, false
	}
	out := make([]byte, rv.Len())
	reflect.Copy(reflect.ValueOf(out), rv)
	return out, true
}

// Decimal renders r exactly in decimal notation, with as many fractional
// digits as it needs: an Avro decimal decodes to a fraction whose
// denominator divides a power of ten, so nothing is rounded. (The scale of
// the schema is not carried by the value: 12.50 renders as 12.5.) Any
// other fraction is rounded to 38 digits.
func Decimal(r *big.Rat) string {
	if r.IsInt() {
		return r.Num().String()
	}
	d := new(big.Int).Set(r.Denom())
	var twos, fives int
	for d.Bit(0) == 0 {
		d.Rsh(d, 1)
		twos++
	}
	five, q, m := big.NewInt(5), new(big.Int), new(big.Int)
	for {
		if q.DivMod(d, five, m); m.Sign() != 0 {
			break
		}
		d.Set(q)
		fives++
	}
	if d.Cmp(big.NewInt(1)) != 0 {
		return r.FloatString(38)
	}
	return r.FloatString(max(twos, fives))
}

// Timestamp renders t in RFC 3339: an instant (a time in UTC) with its
// "Z", a local timestamp (a wall clock, which the decoder gives in
// time.Local) without an offset.
func Timestamp(t time.Time) string {
	if t.Location() == time.UTC {
		return t.Format(time.RFC3339Nano)
	}
	return t.Format("2006-01-02T15:04:05.999999999")
}

// Clock renders an Avro time of day (time-millis, time-micros) as
// Postgres reads a time: "15:04:05.000000", hours beyond 23 as they are.
func Clock(d time.Duration) string {
	neg := ""
	if d < 0 {
		neg, d = "-", -d
	}
	h := d / time.Hour
	m := (d % time.Hour) / time.Minute
	s := (d % time.Minute) / time.Second
	us := (d % time.Second) / time.Microsecond
	if us == 0 {
		return fmt.Sprintf("%s%02d:%02d:%02d", neg, h, m, s)
	}
	return fmt.Sprintf("%s%02d:%02d:%02d.%06d", neg, h, m, s, us)
}
