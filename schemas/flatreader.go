package schemas

import (
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"math"
	"sync/atomic"
)

// Limits of Avro's binary encoding, as hamba/avro enforces them.
const (
	maxIntBytes  = 5  // a zig-zag varint int
	maxLongBytes = 10 // a zig-zag varint long
	// maxByteSlice is the longest string or bytes value decoded: hamba/avro's
	// default Config.MaxByteSliceSize, which the generic path applies.
	maxByteSlice = 1 << 20
)

// flatReader reads Avro's binary encoding from a value held whole in
// memory. It accepts and refuses exactly what hamba/avro's Reader does
// (the same varint limits, union and length checks, and what its Skip
// methods let pass) without its buffering, which a flat record does not
// need: the value is one Kafka record's bytes.
type flatReader struct {
	buf []byte
	pos int
	err error // the first failure; io.ErrUnexpectedEOF when buf ran out
}

func (r *flatReader) fail(op, msg string) {
	if r.err == nil {
		r.err = fmt.Errorf("avro: %s: %s", op, msg)
	}
}

func (r *flatReader) eof() {
	if r.err == nil {
		r.err = io.ErrUnexpectedEOF
	}
}

// long reads a zig-zag varint of at most maxLongBytes bytes.
func (r *flatReader) long() int64 {
	v := r.varint(maxLongBytes, "ReadLong")
	return int64(v>>1) ^ -int64(v&1)
}

// int reads a zig-zag varint of at most maxIntBytes bytes; bits past the
// 32nd are dropped, as hamba/avro drops them.
func (r *flatReader) int() int32 {
	v := uint32(r.varint(maxIntBytes, "ReadInt"))
	return int32(v>>1) ^ -int32(v&1)
}

// varint reads a varint of at most max bytes; op names the read in errors.
func (r *flatReader) varint(max int, op string) uint64 {
	if r.err != nil {
		return 0
	}
	var v uint64
	for i, s := 0, uint(0); i < max; i, s = i+1, s+7 {
		if r.pos == len(r.buf) {
			r.eof()
			return 0
		}
		b := r.buf[r.pos]
		r.pos++
		v |= uint64(b&0x7f) << s
		if b < 0x80 {
			return v
		}
	}
	r.fail(op, "int overflow")
	return 0
}

func (r *flatReader) bool() bool {
	if r.err != nil {
		return false
	}
	if r.pos == len(r.buf) {
		r.eof()
		return false
	}
	b := r.buf[r.pos]
	r.pos++
	if b > 1 {
		r.fail("ReadBool", "invalid bool")
	}
	return b == 1
}

// next returns the next n bytes, which stay r.buf's.
func (r *flatReader) next(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n > len(r.buf)-r.pos {
		r.pos = len(r.buf)
		r.eof()
		return nil
	}
	b := r.buf[r.pos : r.pos+n : r.pos+n]
	r.pos += n
	return b
}

func (r *flatReader) float() float32 {
	b := r.next(4)
	if b == nil {
		return 0
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(b))
}

func (r *flatReader) double() float64 {
	b := r.next(8)
	if b == nil {
		return 0
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b))
}

// bytes returns a string or bytes value's bytes, which stay r.buf's; op
// names the type in errors ("string" or "bytes").
func (r *flatReader) bytes(op string) []byte {
	n := r.long()
	switch {
	case r.err != nil:
		return nil
	case n < 0:
		r.fail(readOp(op), "invalid "+op+" length")
		return nil
	case n > maxByteSlice:
		r.fail(readOp(op), "size is greater than `Config.MaxByteSliceSize`")
		return nil
	}
	return r.next(int(n))
}

func readOp(op string) string {
	if op == "string" {
		return "ReadString"
	}
	return "ReadBytes"
}

// skipVarint passes a varint of at most max bytes. Like hamba/avro's
// SkipInt and SkipLong it stops after max bytes without an error.
func (r *flatReader) skipVarint(max int) {
	for i := 0; i < max && r.err == nil; i++ {
		if r.pos == len(r.buf) {
			r.eof()
			return
		}
		b := r.buf[r.pos]
		r.pos++
		if b < 0x80 {
			return
		}
	}
}

// skipBytes passes a string or bytes value; like hamba/avro's SkipString
// it passes nothing for a length below one.
func (r *flatReader) skipBytes() {
	if n := r.long(); n > 0 {
		r.next(int(min(n, int64(len(r.buf)-r.pos+1)))) // past the end: fails as truncated
	}
}

// Interning: a field that holds few distinct strings (an event type, a
// currency, a status) decodes to one shared boxed value per string, so
// decoding it allocates nothing.
const (
	maxInterned    = 32 // distinct values; a field with more is not interned
	maxInternedLen = 64 // bytes; longer values are never interned
)

// interner hands out the boxed value of a string field's strings while the
// field has held at most maxInterned distinct ones. It is shared by every
// goroutine that decodes with its schema.
type interner struct {
	// vals is replaced, never changed; nil once the field has had more
	// distinct values than are worth keeping (an id, a name).
	vals atomic.Pointer[map[string]any]
}

func newInterner() *interner {
	in := &interner{}
	vals := map[string]any{}
	in.vals.Store(&vals)
	return in
}

// value returns b as a string in an interface.
func (in *interner) value(b []byte) any {
	vals := in.vals.Load()
	if vals == nil || len(b) > maxInternedLen {
		return string(b)
	}
	if v, ok := (*vals)[string(b)]; ok { // no allocation for the lookup
		return v
	}
	if len(*vals) >= maxInterned {
		in.vals.Store(nil)
		return string(b)
	}
	var v any = string(b)
	next := make(map[string]any, len(*vals)+1)
	maps.Copy(next, *vals)
	next[v.(string)] = v
	// Losing the race to another decoder loses this value only: it is
	// added when it comes again.
	in.vals.CompareAndSwap(vals, &next)
	return v
}
