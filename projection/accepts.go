package projection

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hamba/avro/v2"
)

// ErrNotAccepted reports an Avro field whose type a column cannot hold
// (see Accepts).
var ErrNotAccepted = errors.New("column type does not take the field's Avro type")

// Accepts reports whether a column of Postgres type pgType may be filled
// from a field of Avro schema field, following the type mapping documented in
// docs/types.md: nil when it may, an error wrapping ErrNotAccepted saying
// which types it would take when it may not. A nullable union
// (["null", T]) is taken as T. pgType is compared on its canonical name
// (what format_type prints) or a common spelling of it (int8, timestamptz,
// varchar(20)); a name that is none of the built-in types (an enum type, a
// domain, an extension's type) is accepted from a string or an enum,
// which Postgres casts from text.
//
// It is the one place the mapping's acceptance rule lives: projector check
// proves a projection file with it, and the write path converts by it.
func Accepts(pgType string, field avro.Schema) error {
	s, _ := Nullable(field)
	base, array := canonicalType(pgType)
	if u, ok := s.(*avro.UnionSchema); ok && !isJSON(base, array) {
		return acceptsBranches(pgType, u)
	}
	if array {
		switch a := s.(type) {
		case *avro.ArraySchema:
			items, _ := Nullable(a.Items())
			if _, nested := items.(*avro.ArraySchema); nested {
				// An array of arrays fills a multidimensional array,
				// which Postgres types as the one-dimensional one.
				return Accepts(pgType, items)
			}
			if err := Accepts(base, a.Items()); err != nil {
				return fmt.Errorf("array items: %w", err) // err names ErrNotAccepted
			}
			return nil
		case *avro.PrimitiveSchema:
			if a.Type() == avro.String && a.Logical() == nil {
				return nil // an array literal, such as {a,b}, cast by Postgres
			}
		}
		return refuse(pgType, s, "an Avro array")
	}
	want := acceptedBy(s)
	if want == nil {
		return refuse(pgType, s, "")
	}
	if want.types[base] || want.anyType || want.userTypes && !builtin[base] {
		return nil
	}
	return refuse(pgType, s, want.String())
}

func isJSON(base string, array bool) bool { return !array && (base == "json" || base == "jsonb") }

// acceptsBranches accepts a union of several non-null branches into a
// column that is not JSON when the column takes every string, number or
// boolean branch, whose value the engine writes, and, if it has others, is
// a text column, which takes their JSON text.
func acceptsBranches(pgType string, u *avro.UnionSchema) error {
	for _, b := range u.Types() {
		b = deref(b)
		switch b.Type() {
		case avro.Null:
			continue
		case avro.String, avro.Int, avro.Long, avro.Float, avro.Double, avro.Boolean:
			if err := Accepts(pgType, b); err != nil {
				return fmt.Errorf("union branch %s: %w", b.Type(), err) // err names ErrNotAccepted
			}
		default:
			// Another branch (a record, a map, an array) is written as its
			// JSON text, which only a text column holds as it is.
			if base, array := canonicalType(pgType); array || !slices.Contains(textLike, base) {
				return refuse(pgType, u, "jsonb or json; a union of strings, numbers and booleans also fills a column each branch fills, and one with other branches a text column")
			}
		}
	}
	return nil
}

// Nullable returns s without its null branch when s is the union of null
// and one other type, and whether it was.
// A reference to a named type is taken as the type it names.
func Nullable(s avro.Schema) (avro.Schema, bool) {
	s = deref(s)
	u, ok := s.(*avro.UnionSchema)
	if !ok || len(u.Types()) != 2 || !u.Nullable() {
		return s, false
	}
	for _, t := range u.Types() {
		if t.Type() != avro.Null {
			return deref(t), true
		}
	}
	return s, false
}

// deref returns the type a reference to a named type names.
func deref(s avro.Schema) avro.Schema {
	if r, ok := s.(*avro.RefSchema); ok {
		return r.Schema()
	}
	return s
}

// accepted is the column types one Avro type may fill.
type accepted struct {
	types map[string]bool
	// anyType: every type but arrays, which Postgres parses from text
	// (a string's).
	anyType bool
	// userTypes: also every type that is not built in (an enum type).
	userTypes bool
	hint      string
}

func (a *accepted) String() string { return a.hint }

func set(hint string, types ...string) *accepted {
	m := map[string]bool{}
	for _, t := range types {
		m[t] = true
	}
	return &accepted{types: m, hint: hint}
}

var (
	textLike   = []string{"text", "character varying", "character", "citext", "name"}
	jsonTypes  = []string{"jsonb", "json"}
	integers   = []string{"smallint", "integer", "bigint", "numeric", "real", "double precision"}
	floats     = []string{"real", "double precision", "numeric"}
	timestamps = []string{"timestamp with time zone", "timestamp without time zone"}
)

func with(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// acceptedBy returns the column types an Avro type (not a nullable union)
// may fill, nil for none.
func acceptedBy(s avro.Schema) *accepted {
	if l, ok := s.(avro.LogicalTypeSchema); ok && l.Logical() != nil {
		switch l.Logical().Type() {
		case avro.Decimal:
			return set("numeric or text", with([]string{"numeric"}, textLike)...)
		case avro.TimestampMillis, avro.TimestampMicros:
			return set("timestamptz, timestamp or text", with(timestamps, textLike)...)
		case avro.LocalTimestampMillis, avro.LocalTimestampMicros:
			return set("timestamp or text", with([]string{"timestamp without time zone"}, textLike)...)
		case avro.Date:
			return set("date or text", with([]string{"date"}, textLike)...)
		case avro.TimeMillis, avro.TimeMicros:
			return set("time or text", with([]string{"time without time zone"}, textLike)...)
		case avro.UUID:
			return set("uuid or text", with([]string{"uuid"}, textLike)...)
		}
	}
	switch s.Type() {
	case avro.Boolean:
		return set("boolean or text", with([]string{"boolean"}, textLike)...)
	case avro.Int, avro.Long:
		return set("smallint, integer, bigint, numeric, real, double precision or text", with(integers, textLike)...)
	case avro.Float, avro.Double:
		return set("real, double precision, numeric or text", with(floats, textLike)...)
	case avro.String:
		return &accepted{anyType: true, hint: "any type (Postgres casts the text)"}
	case avro.Bytes, avro.Fixed:
		return set("bytea", "bytea")
	case avro.Enum:
		a := set("text, varchar, citext or a Postgres enum type", textLike...)
		a.userTypes = true // an enum type is not built in: see Accepts
		return a
	case avro.Array:
		return set("an array type of its items' type (text[], bigint[] ...), jsonb or json", jsonTypes...)
	case avro.Map, avro.Record, avro.Union:
		return set("jsonb or json", jsonTypes...)
	}
	return nil
}

func refuse(pgType string, s avro.Schema, want string) error {
	if want == "" {
		return fmt.Errorf("%w: column type %s cannot hold Avro %s", ErrNotAccepted, pgType, avroTypeName(s))
	}
	return fmt.Errorf("%w: column type %s cannot hold Avro %s (it fills %s)", ErrNotAccepted, pgType, avroTypeName(s), want)
}

// avroTypeName names an Avro type for a message: its logical type if any.
func avroTypeName(s avro.Schema) string {
	if l, ok := s.(avro.LogicalTypeSchema); ok && l.Logical() != nil {
		return fmt.Sprintf("%s (%s)", s.Type(), l.Logical().Type())
	}
	if n, ok := s.(avro.NamedSchema); ok {
		return fmt.Sprintf("%s %s", s.Type(), n.FullName())
	}
	return string(s.Type())
}

// builtin lists the canonical names of Postgres's built-in types that
// the mapping names, and the others a column commonly has, so that a name
// outside it is taken for a user-defined type.
var builtin = func() map[string]bool {
	m := map[string]bool{}
	for _, t := range with(textLike, jsonTypes, integers, timestamps, []string{
		"boolean", "bytea", "date", "time without time zone", "time with time zone", "uuid", "interval",
		"inet", "cidr", "macaddr", "money", "xml", "tsvector", "point", "bit", "bit varying",
	}) {
		m[t] = true
	}
	return m
}()

// aliases maps the spellings Postgres accepts for built-in types to the
// names format_type prints.
var aliases = map[string]string{
	"int": "integer", "int4": "integer", "int2": "smallint", "int8": "bigint",
	"float": "double precision", "float8": "double precision", "float4": "real",
	"bool": "boolean", "decimal": "numeric",
	"varchar": "character varying", "char": "character", "bpchar": "character",
	"timestamptz": "timestamp with time zone", "timestamp": "timestamp without time zone",
	"time": "time without time zone", "timetz": "time with time zone",
	"public.citext": "citext", "varbit": "bit varying",
}

// canonicalType returns a type name's canonical base name, without type
// modifiers or the array brackets, and whether it is an array type.
func canonicalType(pgType string) (string, bool) {
	t := strings.ToLower(strings.TrimSpace(pgType))
	t = strings.TrimPrefix(t, "pg_catalog.")
	array := false
	for strings.HasSuffix(t, "[]") {
		array, t = true, strings.TrimSpace(strings.TrimSuffix(t, "[]"))
	}
	// Modifiers sit after the name, or inside it: timestamp(3) with time zone.
	if i := strings.IndexByte(t, '('); i >= 0 {
		if j := strings.IndexByte(t[i:], ')'); j >= 0 {
			t = strings.TrimSpace(t[:i]) + t[i+j+1:]
		}
	}
	t = strings.Join(strings.Fields(t), " ")
	if a, ok := aliases[t]; ok {
		t = a
	}
	return t, array
}

// CanonicalType returns the name format_type prints for the base type of
// pgType (a column's type as a projection file writes it), without its
// modifiers, and whether it is an array: what a reader of the table, such
// as the read API's document, needs to tell how its values are written.
func CanonicalType(pgType string) (base string, array bool) { return canonicalType(pgType) }
