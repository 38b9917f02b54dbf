package postgres

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/projector-dev/projector/projection"
)

// column is one array argument of the set-based upsert: the column's values
// of every written row, in binary form where the column's kind has one.
type column interface {
	// set stores row r's value v; exact reports that v already had the
	// Go type a load from Postgres gives (see projection.Column.Stored).
	set(r int, v any) (exact bool, err error)
	arg() any
	sqlType() string // the array parameter's type
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

func newColumn(c projection.Column, rows int) column {
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
func (k *intColumn) arg() any        { return k.a }
func (k *intColumn) sqlType() string { return "int8[]" }

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
func (k *floatColumn) arg() any        { return k.a }
func (k *floatColumn) sqlType() string { return "float8[]" }

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
func (k *boolColumn) arg() any        { return k.a }
func (k *boolColumn) sqlType() string { return "bool[]" }

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
func (k *textColumn) arg() any        { return k.a }
func (k *textColumn) sqlType() string { return "text[]" }
