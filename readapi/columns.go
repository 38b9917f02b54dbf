package readapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/projector-dev/projector/projection"
)

// kind is how a column's values become JSON.
type kind uint8

const (
	kindText        kind = iota // Postgres's text form, as a string
	kindInt                     // smallint, integer, bigint: a number
	kindFloat                   // real, double precision: a number
	kindBool                    // boolean
	kindNumeric                 // numeric: its exact text, as a string
	kindJSON                    // json, jsonb: the JSON itself
	kindBytes                   // bytea: base64
	kindTimestamptz             // RFC 3339 in UTC
	kindTimestamp               // RFC 3339 without an offset
	kindDate                    // YYYY-MM-DD
)

// column is how one column is selected and written.
type column struct {
	name  string
	kind  kind
	array bool
	// precision is a timestamp's fractional digits as declared
	// (timestamptz(3)), -1 when undeclared: then up to 6, as Postgres
	// prints them.
	precision int
	// expr is the column as the SELECT list reads it.
	expr string
	// typ is its type as Postgres names it, without its modifier: a
	// cast to varchar(3) would cut a longer value.
	typ string
	// bits is an integer column's size: 16, 32 or 64.
	bits int
}

// columnNamed returns the column of cols named name.
func columnNamed(cols []column, name string) (column, bool) {
	for _, c := range cols {
		if c.name == name {
			return c, true
		}
	}
	return column{}, false
}

// accepts tells whether a filter's value is one of c's, in the spelling
// the API writes it: an integer in its range, true or false. Values of
// other types are left to PostgreSQL, which refuses what its type cannot
// hold; these two it would take in other spellings too (yes, 0x1F), which
// the document does not give.
func (c column) accepts(value string) bool {
	switch {
	case c.array:
		return true
	case c.kind == kindInt:
		_, err := strconv.ParseInt(value, 10, c.bits)
		return err == nil && !strings.HasPrefix(value, "+")
	case c.kind == kindBool:
		return value == "true" || value == "false"
	}
	return true
}

// spelling names the values accepts takes.
func (c column) spelling() string {
	switch c.kind {
	case kindInt:
		return fmt.Sprintf("a %d-bit integer", c.bits)
	case kindBool:
		return "true or false"
	}
	return "its text form"
}

// intBits is the size of the integer type format_type names base.
func intBits(base string) int {
	switch base {
	case "smallint":
		return 16
	case "integer":
		return 32
	}
	return 64
}

// kindOf is the kind of the type Postgres names base (format_type without
// its modifier).
func kindOf(base string) kind {
	switch base {
	case "smallint", "integer", "bigint":
		return kindInt
	case "real", "double precision":
		return kindFloat
	case "boolean":
		return kindBool
	case "numeric":
		return kindNumeric
	case "json", "jsonb":
		return kindJSON
	case "bytea":
		return kindBytes
	case "timestamp with time zone":
		return kindTimestamptz
	case "timestamp without time zone":
		return kindTimestamp
	case "date":
		return kindDate
	}
	return kindText
}

var precisionRe = regexp.MustCompile(`^timestamp\((\d)\)`)

// newColumn is how column name, of the type Postgres names base (the
// element type for an array) and full (with its modifier), is read.
func newColumn(name, base, full string, array bool) column {
	c := column{name: name, kind: kindOf(base), array: array, precision: -1, typ: base, bits: intBits(base)}
	if m := precisionRe.FindStringSubmatch(full); m != nil {
		c.precision, _ = strconv.Atoi(m[1])
	}
	id := pgx.Identifier{name}.Sanitize()
	// The kinds read as text are cast in the query, which keeps numeric's
	// and JSON's exact text and leaves types the driver does not know
	// (enums, citext, inet, intervals) in Postgres's own form.
	switch {
	case c.kind == kindText && !array && (base == "text" || base == "character varying"):
		c.expr = id
	case c.kind == kindText && !array:
		// The type's output function, as psql shows it: a cast to text
		// would drop char(n)'s padding and add inet's /32.
		c.expr = "CASE WHEN " + id + " IS NULL THEN NULL ELSE format('%s', " + id + ") END"
	case c.kind == kindText || c.kind == kindNumeric || c.kind == kindJSON:
		if array {
			c.expr = id + "::text[]"
		} else {
			c.expr = id + "::text"
		}
	default:
		c.expr = id
	}
	return c
}

// tableColumns reads the types of p's table's columns (its live
// generation's, through the view of a rebuilt projection), the
// projection's columns and version, in the file's order.
func tableColumns(ctx context.Context, q Querier, p *projection.Projection) ([]column, error) {
	rows, err := q.Query(ctx, `
		SELECT a.attname::text,
		       format_type(CASE WHEN t.typcategory = 'A' THEN t.typelem ELSE a.atttypid END, NULL),
		       format_type(a.atttypid, a.atttypmod),
		       t.typcategory = 'A'
		FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`, p.Table)
	if err != nil {
		return nil, fmt.Errorf("projection %q: read the columns of %s: %w", p.Name, p.Table, err)
	}
	have := map[string]column{}
	for rows.Next() {
		var name, base, full string
		var array bool
		if err := rows.Scan(&name, &base, &full, &array); err != nil {
			return nil, fmt.Errorf("projection %q: read the columns of %s: %w", p.Name, p.Table, err)
		}
		have[name] = newColumn(name, base, full, array)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("projection %q: read the columns of %s: %w", p.Name, p.Table, err)
	}
	if len(have) == 0 {
		return nil, fmt.Errorf("projection %q: %w: table %s does not exist yet", p.Name, errNoTable, p.Table)
	}
	out := make([]column, 0, len(p.Columns)+1)
	for _, pc := range p.Columns {
		c, ok := have[pc.Name]
		if !ok {
			return nil, fmt.Errorf("projection %q: table %s has no column %q", p.Name, p.Table, pc.Name)
		}
		out = append(out, c)
	}
	v, ok := have["version"]
	if !ok {
		return nil, fmt.Errorf("projection %q: table %s has no version column", p.Name, p.Table)
	}
	return append(out, v), nil
}

// appendJSON appends the JSON of value v, as scanned from column c.
func (c column) appendJSON(b []byte, v any) ([]byte, error) {
	if v == nil {
		return append(b, "null"...), nil
	}
	if c.array {
		a, ok := v.(*pgtype.Array[any])
		if !ok {
			return nil, fmt.Errorf("column %q: array scanned as %T", c.name, v)
		}
		if !a.Valid {
			return append(b, "null"...), nil
		}
		if len(a.Dims) == 0 {
			return append(b, "[]"...), nil
		}
		elems := a.Elements
		return c.appendDims(b, a.Dims, &elems)
	}
	return c.appendScalar(b, v)
}

// appendDims appends the nested JSON arrays of dims, taking the elements
// off *elems in order.
func (c column) appendDims(b []byte, dims []pgtype.ArrayDimension, elems *[]any) ([]byte, error) {
	b = append(b, '[')
	for i := range int(dims[0].Length) {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if len(dims) > 1 {
			b, err = c.appendDims(b, dims[1:], elems)
		} else {
			if len(*elems) == 0 {
				return nil, fmt.Errorf("column %q: array has fewer elements than its dimensions", c.name)
			}
			b, err = c.appendScalar(b, (*elems)[0])
			*elems = (*elems)[1:]
		}
		if err != nil {
			return nil, err
		}
	}
	return append(b, ']'), nil
}

func (c column) appendScalar(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case string:
		if c.kind == kindJSON {
			if !json.Valid([]byte(v)) {
				return nil, fmt.Errorf("column %q: not JSON", c.name)
			}
			return append(b, v...), nil
		}
		return appendString(b, v), nil
	case int16:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int32:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int64:
		return strconv.AppendInt(b, v, 10), nil
	case float32:
		return appendFloat(b, float64(v), 32), nil
	case float64:
		return appendFloat(b, v, 64), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case []byte:
		return appendString(b, base64.StdEncoding.EncodeToString(v)), nil
	case time.Time:
		return appendString(b, c.formatTime(v)), nil
	case pgtype.InfinityModifier:
		if v == pgtype.Infinity {
			return appendString(b, "infinity"), nil
		}
		return appendString(b, "-infinity"), nil
	}
	return nil, fmt.Errorf("column %q: unexpected value of type %T", c.name, v)
}

// formatTime writes a timestamp with the fractional digits its column
// declares (all six, trailing zeros trimmed, when it declares none).
func (c column) formatTime(t time.Time) string {
	switch c.kind {
	case kindDate:
		return t.Format(time.DateOnly)
	case kindTimestamptz:
		t = t.UTC()
	}
	layout := "2006-01-02T15:04:05"
	switch {
	case c.precision < 0:
		layout += ".999999"
	case c.precision > 0:
		layout += "." + strings.Repeat("0", c.precision)
	}
	if c.kind == kindTimestamptz {
		layout += "Z07:00"
	}
	return t.Format(layout)
}

// appendFloat writes a float as JSON writes it; NaN and the infinities,
// which JSON has no number for, as the strings Postgres prints.
func appendFloat(b []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return appendString(b, "NaN")
	case math.IsInf(f, 1):
		return appendString(b, "Infinity")
	case math.IsInf(f, -1):
		return appendString(b, "-Infinity")
	}
	return strconv.AppendFloat(b, f, 'g', -1, bits)
}

// appendString writes s as encoding/json writes it. Most strings (keys,
// statuses, names) need no escape and are copied; the others go through
// encoding/json, whose escapes (of <, > and & among them) they keep.
func appendString(b []byte, s string) []byte {
	plain := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			plain = false
			break
		}
	}
	if plain {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	j, _ := json.Marshal(s) // a string always marshals
	return append(b, j...)
}
