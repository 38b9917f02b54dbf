package postgres

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/projector-dev/projector/projection"
)

// column is the array arguments of one column in the set-based upsert: the
// column's values of every written row, in binary form where the column's
// kind has one.
type column interface {
	// set stores row r's value v; exact reports that v already had the
	// Go type a load from Postgres gives (see projection.Column.Stored).
	set(r int, v any) (exact bool, err error)
	args() []any
	sqlTypes() []string // the array parameters' types
	// expr is the SQL expression of the column's value from the unnested
	// parameters, named names (one per sqlTypes).
	expr(names []string) string
}

// pgArray is a one-dimensional array argument that pgx encodes element by
// element through the elements' own valuer interfaces (no reflection, no
// allocation per element). An element that is not Valid is NULL.
type pgArray[T any] []T

func (a pgArray[T]) Dimensions() []pgtype.ArrayDimension {
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}
func (a pgArray[T]) Index(i int) any { return &a[i] }
func (a pgArray[T]) IndexType() any  { return new(T) }

// newColumn returns the arrays of c for rows rows; key is true for the
// projection's key column, which always travels as one text array.
func newColumn(c projection.Column, key bool, rows int) column {
	if !key && isTimestamptz(c.Type) {
		return &timeColumn{c: c, t: make(pgArray[pgtype.Timestamptz], rows), s: make(pgArray[pgtype.Text], rows)}
	}
	switch c.Kind() {
	case projection.KindInt:
		return &intColumn{c: c, a: make(pgArray[pgtype.Int8], rows)}
	case projection.KindFloat:
		single := c.Type == "real" || c.Type == "float4"
		return &floatColumn{c: c, a: make(pgArray[pgtype.Float8], rows), single: single}
	case projection.KindBool:
		return &boolColumn{c: c, a: make(pgArray[pgtype.Bool], rows)}
	}
	return &textColumn{c: c, a: make(pgArray[pgtype.Text], rows)}
}

// convert turns v into the Go type of c's kind (Row values normally are).
func convert[T any](c projection.Column, v any) (T, error) {
	if x, ok := v.(T); ok {
		return x, nil
	}
	conv, err := c.Convert(v)
	if err != nil {
		var zero T
		return zero, err
	}
	x, ok := conv.(T)
	if !ok {
		var zero T
		return zero, fmt.Errorf("column %s (%s): cannot hold %T value %v", c.Name, c.Type, v, v)
	}
	return x, nil
}

type intColumn struct {
	c projection.Column
	a pgArray[pgtype.Int8]
}

func (k *intColumn) set(r int, v any) (bool, error) {
	switch x := v.(type) {
	case nil:
		return true, nil
	case int64:
		k.a[r] = pgtype.Int8{Int64: x, Valid: true}
		return true, nil
	}
	n, err := convert[int64](k.c, v)
	k.a[r] = pgtype.Int8{Int64: n, Valid: err == nil}
	return false, err
}
func (k *intColumn) args() []any                { return []any{k.a} }
func (k *intColumn) sqlTypes() []string         { return []string{"int8[]"} }
func (k *intColumn) expr(names []string) string { return names[0] + "::" + castType(k.c.Type) }

type floatColumn struct {
	c      projection.Column
	a      pgArray[pgtype.Float8]
	single bool // real: Postgres rounds the value
}

func (k *floatColumn) set(r int, v any) (bool, error) {
	switch x := v.(type) {
	case nil:
		return true, nil
	case float64:
		k.a[r] = pgtype.Float8{Float64: x, Valid: true}
		return !k.single, nil
	}
	f, err := convert[float64](k.c, v)
	k.a[r] = pgtype.Float8{Float64: f, Valid: err == nil}
	return false, err
}
func (k *floatColumn) args() []any                { return []any{k.a} }
func (k *floatColumn) sqlTypes() []string         { return []string{"float8[]"} }
func (k *floatColumn) expr(names []string) string { return names[0] + "::" + castType(k.c.Type) }

type boolColumn struct {
	c projection.Column
	a pgArray[pgtype.Bool]
}

func (k *boolColumn) set(r int, v any) (bool, error) {
	switch x := v.(type) {
	case nil:
		return true, nil
	case bool:
		k.a[r] = pgtype.Bool{Bool: x, Valid: true}
		return true, nil
	}
	b, err := convert[bool](k.c, v)
	k.a[r] = pgtype.Bool{Bool: b, Valid: err == nil}
	return false, err
}
func (k *boolColumn) args() []any                { return []any{k.a} }
func (k *boolColumn) sqlTypes() []string         { return []string{"bool[]"} }
func (k *boolColumn) expr(names []string) string { return names[0] + "::" + castType(k.c.Type) }

// textColumn carries every other type in Postgres text form, cast to the
// column's type in SQL.
type textColumn struct {
	c projection.Column
	a pgArray[pgtype.Text]
}

func (k *textColumn) set(r int, v any) (bool, error) {
	switch x := v.(type) {
	case nil:
		return true, nil
	case string:
		k.a[r] = pgtype.Text{String: x, Valid: true}
		return true, nil
	}
	t, err := k.c.EncodeText(v)
	if err != nil || t == nil {
		return false, err
	}
	k.a[r] = pgtype.Text{String: *t, Valid: true}
	return false, nil
}
func (k *textColumn) args() []any                { return []any{k.a} }
func (k *textColumn) sqlTypes() []string         { return []string{"text[]"} }
func (k *textColumn) expr(names []string) string { return names[0] + "::" + castType(k.c.Type) }

// timeColumn carries a timestamptz column in binary when its value is a
// time Go reads exactly as Postgres would (Postgres parsing a timestamp
// from text is dear on the hot path), and as text otherwise: a second
// array holds those values, cast in SQL as every text column is.
type timeColumn struct {
	c projection.Column
	t pgArray[pgtype.Timestamptz]
	s pgArray[pgtype.Text]
}

func (k *timeColumn) set(r int, v any) (bool, error) {
	switch x := v.(type) {
	case nil:
		return true, nil
	case string:
		if t, ok := parseTimestamptz(x); ok {
			k.t[r] = pgtype.Timestamptz{Time: t, Valid: true}
		} else {
			k.s[r] = pgtype.Text{String: x, Valid: true}
		}
		return true, nil
	case time.Time:
		if t, ok := exactTime(x); ok {
			k.t[r] = pgtype.Timestamptz{Time: t, Valid: true}
			return false, nil
		}
	}
	t, err := k.c.EncodeText(v)
	if err != nil || t == nil {
		return false, err
	}
	k.s[r] = pgtype.Text{String: *t, Valid: true}
	return false, nil
}
func (k *timeColumn) args() []any        { return []any{k.t, k.s} }
func (k *timeColumn) sqlTypes() []string { return []string{"timestamptz[]", "text[]"} }
func (k *timeColumn) expr(names []string) string {
	return fmt.Sprintf("coalesce(%s, %s::%s)", names[0], names[1], castType(k.c.Type))
}

// castType is the type a value is cast to on its way into a column of
// type typ (a canonical name, as format_type prints it): typ itself but
// for the types whose length an explicit cast cuts a value to where an
// assignment refuses one that does not fit (varchar(n), char(n), bit(n)
// and varbit(n), and arrays of them). Those are cast to the type without
// its length, and the column's assignment refuses a value too long
// (22001, or 22026 for bit(n)), which dead-letters its event rather than
// storing it cut short.
func castType(typ string) string {
	elem, dims := typ, ""
	if i := strings.Index(typ, "["); i > 0 {
		elem, dims = typ[:i], typ[i:]
	}
	open := strings.IndexByte(elem, '(')
	if open < 0 || !strings.HasSuffix(elem, ")") {
		return typ
	}
	switch elem[:open] {
	case "character varying":
		return "character varying" + dims
	case "character":
		return "bpchar" + dims // "character" alone is character(1)
	case "bit", "bit varying":
		return "bit varying" + dims // "bit" alone is bit(1)
	}
	return typ
}

func isTimestamptz(pgType string) bool {
	return pgType == "timestamptz" || pgType == "timestamp with time zone"
}

// parseTimestamptz parses s when it is in a form rows hold timestamps in
// (RFC 3339 as projections write them, or as Postgres renders them with
// the default DateStyle, offsets of whole hours or hours and minutes) and
// means the same instant to Go and to Postgres; otherwise Postgres parses
// it.
func parseTimestamptz(s string) (time.Time, bool) {
	if len(s) < len("2006-01-02 15:04:05Z") || s[4] != '-' {
		return time.Time{}, false // no four-digit year first: not one of ours
	}
	layouts := []string{"2006-01-02 15:04:05.999999999Z07", "2006-01-02 15:04:05.999999999Z07:00"}
	if s[10] == 'T' {
		layouts = []string{time.RFC3339Nano}
	}
	for _, layout := range layouts {
		if t, err := time.Parse(layout, s); err == nil {
			return exactTime(t)
		}
	}
	return time.Time{}, false
}

// exactTime reports whether t is sent in binary without changing what
// Postgres stores: Postgres rounds text input to microseconds (pgx would
// truncate) and refuses year 0, which Go accepts.
func exactTime(t time.Time) (time.Time, bool) {
	if t.Nanosecond()%1000 != 0 || t.Year() < 1 || t.Year() > 9999 {
		return time.Time{}, false
	}
	return t, true
}
