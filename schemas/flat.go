package schemas

import (
	"fmt"
	"io"
	"time"

	"github.com/hamba/avro/v2"
)

// flatRecord decodes records whose fields are all scalars — the shape of
// most domain events — straight from the Avro binary into the record's
// map or values, without hamba/avro's generic decoding (which allocates
// every value through reflection before copying it into the map: about
// half of the time it takes to decode such an event) and without its
// buffered Reader (see flatReader). It produces exactly what the
// generic path produces (a test compares both on random schemas and
// values) and is only built when that is certain: every reader field is
// in the writer with the same type, and every writer field the reader
// lacks is a scalar to skip. Anything else (defaults, promotions, aliases,
// nested types) goes through hamba/avro.
type flatRecord struct {
	fields []flatField // the writer's fields, in order
	read   int         // fields that go into the map
}

// Without a reader schema every writer field is kept, in the writer's
// order; with one, a kept field's slot is its index among the reader's
// fields (see decodeValues).

// flatField is one writer field, kept in the record or skipped.
type flatField struct {
	name string // the writer's, and the reader's when kept
	keep bool
	kind scalar
	// null is the union index of null in a ["null", T] or [T, "null"]
	// field; -1 when the field is not a union.
	null int64
	size int // fixed: its size
	slot int // kept: its index among the reader's fields (the writer's without one)
	// intern boxes the strings of a kept string field (see interner).
	intern *interner
}

type scalar uint8

const (
	scalarBoolean scalar = iota + 1
	scalarInt
	scalarLong
	scalarFloat
	scalarDouble
	scalarString
	scalarBytes
	scalarTimestampMillis
	scalarTimestampMicros
	scalarEnum  // only skipped: an int index
	scalarFixed // only skipped: size bytes
)

type primitive struct {
	typ     avro.Type
	logical avro.LogicalType
}

// flatScalars are the primitive types the flat decoder reads, with the
// logical types it converts as hamba/avro does.
var flatScalars = map[primitive]scalar{
	{avro.Boolean, ""}:                scalarBoolean,
	{avro.Int, ""}:                    scalarInt,
	{avro.Long, ""}:                   scalarLong,
	{avro.Long, avro.TimestampMillis}: scalarTimestampMillis,
	{avro.Long, avro.TimestampMicros}: scalarTimestampMicros,
	{avro.Float, ""}:                  scalarFloat,
	{avro.Double, ""}:                 scalarDouble,
	{avro.String, ""}:                 scalarString,
	{avro.Bytes, ""}:                  scalarBytes,
}

// newFlatRecord returns the flat decoder of values written with writer and
// read with reader (nil: read as written), or nil when the values need
// hamba/avro's resolution.
func newFlatRecord(writer, reader avro.Schema) *flatRecord {
	w, ok := deref(writer).(*avro.RecordSchema)
	if !ok {
		return nil
	}
	var r *avro.RecordSchema
	if reader != nil {
		if r, ok = deref(reader).(*avro.RecordSchema); !ok {
			return nil
		}
	}
	byName := map[string]*avro.Field{}
	if r != nil {
		for _, f := range r.Fields() {
			if len(f.Aliases()) > 0 {
				return nil
			}
			byName[f.Name()] = f
		}
	}
	slots := map[string]int{}
	if r != nil {
		for i, f := range r.Fields() {
			slots[f.Name()] = i
		}
	}
	fr := &flatRecord{}
	for _, wf := range w.Fields() {
		kind, null, size, ok := flatType(wf.Type())
		if !ok {
			return nil
		}
		f := flatField{name: wf.Name(), kind: kind, null: null, size: size}
		rf := wf
		if r != nil {
			rf = byName[wf.Name()]
			delete(byName, wf.Name())
		}
		if rf != nil {
			if kind == scalarEnum || kind == scalarFixed || !sameFlatType(wf.Type(), rf.Type()) {
				return nil
			}
			f.keep = true
			if kind == scalarString {
				f.intern = newInterner()
			}
			f.slot = fr.read
			if r != nil {
				f.slot = slots[wf.Name()]
			}
			fr.read++
		}
		fr.fields = append(fr.fields, f)
	}
	if len(byName) > 0 {
		return nil // a reader field the writer lacks: its default
	}
	return fr
}

// flatType classifies a field type the flat decoder handles.
func flatType(s avro.Schema) (kind scalar, null int64, size int, ok bool) {
	null = -1
	if u, isUnion := deref(s).(*avro.UnionSchema); isUnion {
		types := u.Types()
		if len(types) != 2 {
			return 0, 0, 0, false
		}
		switch {
		case types[0].Type() == avro.Null:
			null, s = 0, types[1]
		case types[1].Type() == avro.Null:
			null, s = 1, types[0]
		default:
			return 0, 0, 0, false
		}
	}
	switch t := deref(s).(type) {
	case *avro.PrimitiveSchema:
		var logical avro.LogicalType
		if ls := t.Logical(); ls != nil {
			logical = ls.Type()
		}
		if k, ok := flatScalars[primitive{t.Type(), logical}]; ok {
			return k, null, 0, true
		}
	case *avro.EnumSchema:
		return scalarEnum, null, 0, true
	case *avro.FixedSchema:
		return scalarFixed, null, t.Size(), true
	}
	return 0, 0, 0, false
}

// sameFlatType reports whether a field of type w is read as type r without
// any resolution.
func sameFlatType(w, r avro.Schema) bool {
	wk, wn, _, wok := flatType(w)
	rk, rn, _, rok := flatType(r)
	return wok && rok && wk == rk && wn == rn
}

// decode reads one record from body into a new map.
func (fr *flatRecord) decode(body []byte) (map[string]any, error) {
	rec := make(map[string]any, fr.read)
	if err := fr.each(body, nil, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// decodeValues reads one record from body into vals, each kept field's
// value at its slot.
func (fr *flatRecord) decodeValues(body []byte, vals []any) error {
	return fr.each(body, vals, nil)
}

// each reads one record from body, each kept field's value into vals at
// its slot or, with vals nil, into rec under its name. It fails, as
// Decoder.read does, unless the record is the whole body.
func (fr *flatRecord) each(body []byte, vals []any, rec map[string]any) error {
	r := flatReader{buf: body}
	for i := range fr.fields {
		f := &fr.fields[i]
		var v any
		if f.null >= 0 {
			switch idx := r.long(); {
			case r.err != nil:
			case idx == f.null:
				if f.keep {
					if vals != nil {
						vals[f.slot] = nil
					} else {
						rec[f.name] = nil
					}
				}
				continue
			case idx != 1-f.null:
				r.fail("flat decode", fmt.Sprintf("field %s: union index %d out of range", f.name, idx))
			}
		}
		if r.err != nil {
			break
		}
		if !f.keep {
			r.skip(f)
			continue
		}
		switch f.kind {
		case scalarBoolean:
			v = r.bool()
		case scalarInt:
			v = int(r.int())
		case scalarLong:
			v = r.long()
		case scalarTimestampMillis:
			// As hamba/avro converts them.
			i := r.long()
			sec := i / 1e3
			v = time.Unix(sec, (i-sec*1e3)*1e6).UTC()
		case scalarTimestampMicros:
			i := r.long()
			sec := i / 1e6
			v = time.Unix(sec, (i-sec*1e6)*1e3).UTC()
		case scalarFloat:
			v = r.float()
		case scalarDouble:
			v = r.double()
		case scalarString:
			b := r.bytes("string")
			switch {
			case len(b) == 0:
				v = ""
			case f.intern != nil:
				v = f.intern.value(b)
			default:
				v = string(b)
			}
		case scalarBytes:
			// A copy of its own: the value outlives the record's bytes,
			// and appending to it must not reach anything else.
			if b := r.bytes("bytes"); r.err == nil {
				v = append(make([]byte, 0, len(b)), b...)
			}
		}
		if vals != nil {
			vals[f.slot] = v
		} else {
			rec[f.name] = v
		}
	}
	switch {
	case r.err == io.ErrUnexpectedEOF:
		return fmt.Errorf("%w: truncated body (%v)", ErrUndecodable, r.err)
	case r.err != nil:
		return fmt.Errorf("%w: %v", ErrUndecodable, r.err)
	case r.pos < len(body):
		return fmt.Errorf("%w: trailing bytes after the record", ErrUndecodable)
	}
	return nil
}

// skip reads past a field the reader does not keep.
func (r *flatReader) skip(f *flatField) {
	switch f.kind {
	case scalarBoolean:
		r.next(1)
	case scalarInt, scalarEnum:
		r.skipVarint(maxIntBytes)
	case scalarLong, scalarTimestampMillis, scalarTimestampMicros:
		r.skipVarint(maxLongBytes)
	case scalarFloat:
		r.next(4)
	case scalarDouble:
		r.next(8)
	case scalarString, scalarBytes:
		r.skipBytes()
	case scalarFixed:
		r.next(f.size)
	}
}
