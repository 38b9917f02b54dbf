package schemas

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"golang.org/x/sync/singleflight"

	"github.com/projector-dev/projector/internal/avrojson"
)

// Terminal decode failures. Each is about the value itself (or its schema),
// so retrying the same value can never succeed; match them with errors.Is
// or IsTerminal. Errors returned by Decode wrap them with context such as
// the schema id.
var (
	// ErrMalformed: the value is not in the Confluent wire format (shorter
	// than 5 bytes, or a magic byte other than 0).
	ErrMalformed = errors.New("malformed wire-format value")

	// ErrUnknownSchema: the registry answered that the schema id does not
	// exist (error code 40403). This is not cached: the id may be
	// registered later.
	ErrUnknownSchema = errors.New("unknown schema id")

	// ErrIncompatible: the writer schema cannot be resolved into the
	// reader schema. Also used for writer schemas this package cannot use
	// at all: not Avro, with schema references, not parsable, not a
	// record, or recursive when a reader schema is set.
	ErrIncompatible = errors.New("writer schema incompatible with reader schema")

	// ErrUndecodable: the Avro body does not decode under its writer
	// schema: truncated, invalid, or followed by trailing bytes.
	ErrUndecodable = errors.New("value does not decode under its writer schema")
)

// IsTerminal reports whether err is one of ErrMalformed, ErrUnknownSchema,
// ErrIncompatible or ErrUndecodable, i.e. whether retrying the same value
// is pointless. Every other Decode error (registry unreachable, 5xx,
// timeout, cancelled context) is transient.
func IsTerminal(err error) bool {
	return errors.Is(err, ErrMalformed) ||
		errors.Is(err, ErrUnknownSchema) ||
		errors.Is(err, ErrIncompatible) ||
		errors.Is(err, ErrUndecodable)
}

// Registry is what the decoder needs from a schema registry. *sr.Client
// satisfies it; tests may wrap it.
//
// An id that does not exist must be reported as an error for which
// errors.As finds an *sr.ResponseError with ErrorCode 40403
// (sr.ErrSchemaNotFound.Code), as *sr.Client does.
type Registry interface {
	SchemaByID(ctx context.Context, id int) (sr.Schema, error)
}

var _ Registry = (*sr.Client)(nil)

const (
	// wireHeaderLen is the magic byte plus the 4-byte schema id.
	wireHeaderLen = 5

	// maxSliceElems bounds how many elements one Avro array may claim.
	// Elements of type null take no bytes, so without a bound a few bytes
	// of garbage could ask for a huge allocation.
	maxSliceElems = 1 << 20

	// fetchTimeout bounds one shared registry lookup. The lookup does not
	// inherit the caller's cancellation (other callers may be waiting on
	// it), so it needs a bound of its own.
	fetchTimeout = 30 * time.Second
)

// Decoder decodes Confluent wire-format values (magic byte 0, 4-byte
// big-endian schema id, Avro binary) into a reader schema.
//
// Writer schemas are fetched from the registry by id on first sight,
// parsed, resolved against the reader schema and cached per id for the
// life of the Decoder; concurrent first lookups of one id share a single
// registry call. Decoding with a cached id takes no lock (one atomic load)
// and does not parse anything.
//
// A Decoder is safe for concurrent use.
//
// # Decoded values
//
// Decode returns the record as a map[string]any keyed by field name (the
// reader's names; writer fields the reader lacks are absent, reader fields
// the writer lacks hold their defaults). Field values, as hamba/avro
// produces them:
//
//	null                       nil
//	boolean                    bool
//	int                        int (not int32)
//	long                       int64
//	float                      float32
//	double                     float64
//	string, enum               string
//	bytes                      []byte (capacity clipped to its length)
//	fixed                      [N]byte (an array, not a slice)
//	record                     map[string]any
//	array                      []any
//	map                        map[string]any
//	timestamp-millis/micros    time.Time in UTC
//	local-timestamp-millis/micros  time.Time in time.Local
//	date                       time.Time in UTC (midnight)
//	time-millis, time-micros   time.Duration
//	decimal (bytes or fixed)   *big.Rat
//	duration (fixed)           avro.LogicalDuration
//	uuid                       string
//
// Unions: a union with a single non-null branch (["null", T], in either
// order) yields nil or the plain T value. A union with several non-null
// branches yields the plain value when every branch is a primitive or a
// primitive logical type listed above; otherwise hamba/avro's tagged form
// map[string]any{"<branch name>": value} is kept, the branch name being
// the full name of a named type ("demo.accounts.Money") or the type
// ("array", "map", "long.local-timestamp-millis"), so that the branch can
// be told apart. With UnionsAsJSON such a union (of two or more non-null
// branches) decodes to a json.RawMessage instead.
//
// For the demo schemas (account_event.avsc): account_id, type: string;
// version, amount: int64; owner: nil or string; occurred_at: time.Time
// (UTC); currency (v2 reader): string.
type Decoder struct {
	reg    Registry
	reader avro.Schema
	api    avro.API
	pool   sync.Pool // *avro.Reader bound to api

	names []string // the reader's field names; nil without a reader schema

	unionsJSON bool // see UnionsAsJSON

	mu      sync.Mutex                     // serialises writers of entries
	entries atomic.Pointer[map[int]*entry] // copy-on-write, read without locks
	group   singleflight.Group
}

// entry is what the decoder knows about one schema id.
type entry struct {
	schema avro.Schema // what to decode with: resolved (or writer) record
	norm   normalizer  // rewrites hamba's output; nil when nothing to do
	flat   *flatRecord // decodes without hamba/avro's generic decoding; nil when it cannot
	err    error       // permanent failure for this id (wraps ErrIncompatible)
	// fields is how many fields a decoded record holds (the reader's),
	// 0 when unknown. hamba/avro would size the record's map for every
	// writer field, the skipped ones included.
	fields int
}

// NewDecoder returns a Decoder that looks writer schemas up in reg and
// decodes into reader. With a nil reader every value is decoded with its
// writer schema as-is.
func NewDecoder(reg Registry, reader avro.Schema, opts ...Option) *Decoder {
	// A private API per Decoder: hamba's decoder cache is keyed by schema
	// fingerprints and its union type resolver by global registrations
	// (avro.Register); keeping them private makes decoding independent of
	// whatever else the process does with avro.DefaultConfig.
	api := avro.Config{MaxSliceAllocSize: maxSliceElems}.Freeze()
	d := &Decoder{reg: reg, reader: reader, api: api}
	for _, o := range opts {
		o(d)
	}
	if rec, ok := deref(reader).(*avro.RecordSchema); ok {
		for _, f := range rec.Fields() {
			d.names = append(d.names, f.Name())
		}
	}
	d.pool.New = func() any { return avro.NewReader(nil, 0, avro.WithReaderConfig(api)) }
	empty := map[int]*entry{}
	d.entries.Store(&empty)
	return d
}

// Option configures a Decoder.
type Option func(*Decoder)

// UnionsAsJSON makes a union with two or more non-null branches decode to
// a json.RawMessage: its branch's value as JSON (avrojson.Marshal), null
// for null, without the branch's name. Its values then fill a json or
// jsonb column as they are, and a string branch is told from JSON text.
// By default such a union decodes as described under Decoder.
func UnionsAsJSON() Option { return func(d *Decoder) { d.unionsJSON = true } }

// Decode decodes one wire-format value. It returns the decoded record and
// the writer schema id taken from the value's header (0 when the value is
// malformed). See Decoder for the Go types of the record's values and the
// Err variables for how failures are classified.
func (d *Decoder) Decode(ctx context.Context, value []byte) (map[string]any, int, error) {
	e, id, err := d.entry(ctx, value)
	if err != nil {
		return nil, id, err
	}
	rec, err := d.decode(e, value[wireHeaderLen:])
	if err != nil {
		return nil, id, fmt.Errorf("schema id %d: %w", id, err)
	}
	return rec, id, nil
}

// entry checks value's wire-format header and returns the entry of its
// schema id.
func (d *Decoder) entry(ctx context.Context, value []byte) (*entry, int, error) {
	if len(value) < wireHeaderLen {
		return nil, 0, fmt.Errorf("%w: %d bytes, need at least %d", ErrMalformed, len(value), wireHeaderLen)
	}
	if value[0] != 0 {
		return nil, 0, fmt.Errorf("%w: magic byte %#x, want 0", ErrMalformed, value[0])
	}
	id := int(int32(binary.BigEndian.Uint32(value[1:wireHeaderLen])))

	e := (*d.entries.Load())[id]
	if e == nil {
		var err error
		if e, err = d.fetch(ctx, id); err != nil {
			return nil, id, err
		}
	}
	if e.err != nil {
		return nil, id, e.err
	}
	return e, id, nil
}

// Width is how many values DecodeValues writes: the reader schema's
// fields (0 without a reader schema, when it always returns maps).
func (d *Decoder) Width() int { return len(d.names) }

// DecodeValues decodes like Decode, but a record of scalar fields that
// needs no resolution beyond dropping writer fields is written into vals
// (of length Width), each reader field's value at its index in names,
// which are the reader's field names (the same for every record): no map
// is made. Any other record is returned as Decode returns it, with names
// nil.
func (d *Decoder) DecodeValues(ctx context.Context, value []byte, vals []any) (names []string, rec map[string]any, id int, err error) {
	e, id, err := d.entry(ctx, value)
	if err != nil {
		return nil, nil, id, err
	}
	if e.flat == nil || d.names == nil || len(vals) < len(d.names) {
		rec, err := d.decode(e, value[wireHeaderLen:])
		if err != nil {
			return nil, nil, id, fmt.Errorf("schema id %d: %w", id, err)
		}
		return nil, rec, id, nil
	}
	if err := e.flat.decodeValues(value[wireHeaderLen:], vals); err != nil {
		return nil, nil, id, fmt.Errorf("schema id %d: %w", id, err)
	}
	return d.names, nil, id, nil
}

// fetch looks id up in the registry, builds its entry and caches it. All
// concurrent callers for one id share one registry call; each caller stops
// waiting when its own ctx is done.
func (d *Decoder) fetch(ctx context.Context, id int) (*entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("schema id %d: %w", id, context.Cause(ctx))
	}
	ch := d.group.DoChan(strconv.Itoa(id), func() (any, error) {
		// A flight that finished between our cache miss and joining the
		// group has cached the entry already.
		if e := (*d.entries.Load())[id]; e != nil {
			return e, nil
		}
		// The lookup is shared: one caller giving up must not fail the
		// others, so it runs detached from the caller's cancellation
		// (keeping its values) under a timeout of its own.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fetchTimeout)
		defer cancel()
		s, err := d.reg.SchemaByID(fctx, id)
		if err != nil {
			var re *sr.ResponseError
			if errors.As(err, &re) && re.ErrorCode == sr.ErrSchemaNotFound.Code {
				return nil, fmt.Errorf("schema id %d: %w: %w", id, ErrUnknownSchema, err)
			}
			return nil, fmt.Errorf("schema id %d: registry lookup: %w", id, err)
		}
		e := d.build(id, s)
		d.store(id, e)
		return e, nil
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		return res.Val.(*entry), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("schema id %d: waiting for registry: %w", id, context.Cause(ctx))
	}
}

// store adds e under id to the copy-on-write cache.
func (d *Decoder) store(id int, e *entry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	old := *d.entries.Load()
	next := make(map[int]*entry, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[id] = e
	d.entries.Store(&next)
}

// build parses the writer schema s and resolves it into the reader schema.
// Failures are permanent for the id (its schema never changes) and are
// cached as an entry with err set.
func (d *Decoder) build(id int, s sr.Schema) (e *entry) {
	fail := func(format string, a ...any) *entry {
		return &entry{err: fmt.Errorf("schema id %d: %w: %s", id, ErrIncompatible, fmt.Sprintf(format, a...))}
	}
	defer func() {
		if p := recover(); p != nil {
			e = fail("avro panic: %v", p)
		}
	}()
	if s.Type != sr.TypeAvro {
		return fail("schema type %s, only AVRO is supported", s.Type)
	}
	if len(s.References) > 0 {
		return fail("schema references are not supported")
	}
	// A fresh cache: avro.Parse would resolve names through (and add them
	// to) the process-wide avro.DefaultSchemaCache.
	writer, err := avro.ParseWithCache(s.Schema, "", &avro.SchemaCache{})
	if err != nil {
		return fail("parsing writer schema: %v", err)
	}
	schema := writer
	if d.reader != nil {
		// hamba/avro's Resolve recurses without bound (a fatal stack
		// overflow, not a panic) on recursive writer schemas.
		if isRecursive(writer) {
			return fail("recursive writer schemas cannot be resolved")
		}
		// A fresh SchemaCompatibility each time: its memo is not safe
		// for concurrent use with different schemas.
		schema, err = avro.NewSchemaCompatibility().Resolve(d.reader, writer)
		if err != nil {
			return fail("%v", err)
		}
	}
	if deref(schema).Type() != avro.Record {
		return fail("top-level schema is %s, want a record", deref(schema).Type())
	}
	e = &entry{schema: schema, flat: newFlatRecord(writer, d.reader)}
	if e.flat == nil { // the flat decoder produces the documented form itself
		e.norm = newNormalizer(d.api, schema, d.unionsJSON)
	}
	if rec, ok := deref(d.reader).(*avro.RecordSchema); ok {
		e.fields = len(rec.Fields())
	}
	return e
}

// decode decodes an Avro body under e's schema.
func (d *Decoder) decode(e *entry, body []byte) (rec map[string]any, err error) {
	if e.flat != nil {
		return e.flat.decode(body)
	}
	err = d.read(body, func(r *avro.Reader) {
		// Not avro.Unmarshal: it treats running out of input as success
		// and returns zero values for the missing fields.
		if e.fields > 0 {
			rec = make(map[string]any, e.fields)
		}
		r.ReadVal(e.schema, &rec)
	})
	if err != nil {
		return nil, err
	}
	if rec == nil {
		rec = map[string]any{}
	}
	if e.norm != nil {
		rec = e.norm(rec).(map[string]any)
	}
	return rec, nil
}

// read runs decode on a pooled reader over body and checks that it read
// the whole body without error.
func (d *Decoder) read(body []byte, decode func(r *avro.Reader)) (err error) {
	r := d.pool.Get().(*avro.Reader)
	r.Reset(body)
	r.Error = nil
	defer func() {
		if p := recover(); p != nil {
			// The reader's state is unknown: drop it rather than pool it.
			err = fmt.Errorf("%w: decoder panic: %v", ErrUndecodable, p)
			return
		}
		r.Reset(nil)
		r.Error = nil
		d.pool.Put(r)
	}()
	decode(r)
	if r.Error != nil {
		if errors.Is(r.Error, io.EOF) {
			return fmt.Errorf("%w: truncated body (%v)", ErrUndecodable, r.Error)
		}
		return fmt.Errorf("%w: %v", ErrUndecodable, r.Error)
	}
	// Peek sets io.EOF when every byte has been consumed.
	if r.Peek(); r.Error == nil {
		return fmt.Errorf("%w: trailing bytes after the record", ErrUndecodable)
	}
	return nil
}

// deref follows a reference to the schema it names.
func deref(s avro.Schema) avro.Schema {
	if r, ok := s.(*avro.RefSchema); ok {
		return r.Schema()
	}
	return s
}

// isRecursive reports whether a record in s refers to itself, directly or
// through other types.
func isRecursive(s avro.Schema) bool {
	onPath := map[avro.Schema]bool{}
	done := map[avro.Schema]bool{}
	var walk func(avro.Schema) bool
	walk = func(s avro.Schema) bool {
		s = deref(s)
		switch t := s.(type) {
		case *avro.RecordSchema:
			if onPath[t] {
				return true
			}
			if done[t] {
				return false
			}
			onPath[t] = true
			for _, f := range t.Fields() {
				if walk(f.Type()) {
					return true
				}
			}
			onPath[t] = false
			done[t] = true
		case *avro.ArraySchema:
			return walk(t.Items())
		case *avro.MapSchema:
			return walk(t.Values())
		case *avro.UnionSchema:
			for _, b := range t.Types() {
				if walk(b) {
					return true
				}
			}
		}
		return false
	}
	return walk(s)
}

// normalizer rewrites a value hamba/avro decoded into its documented form
// (see Decoder). Records, arrays and maps are rewritten in place.
type normalizer func(any) any

// newNormalizer returns the normalizer for values of schema s, or nil when
// hamba/avro's output already has the documented form (as for the demo
// schemas), so that the common case costs nothing.
func newNormalizer(api avro.API, s avro.Schema, unionsJSON bool) normalizer {
	b := normBuilder{api: api, recs: map[*avro.RecordSchema]*recState{}, unionsJSON: unionsJSON}
	return b.build(s)
}

type normBuilder struct {
	api        avro.API
	recs       map[*avro.RecordSchema]*recState
	unionsJSON bool // see UnionsAsJSON
}

// recState breaks recursion through named records.
type recState struct {
	fn   normalizer
	done bool
}

func (b *normBuilder) build(s avro.Schema) normalizer {
	switch t := deref(s).(type) {
	case *avro.RecordSchema:
		return b.record(t)
	case *avro.ArraySchema:
		items := b.build(t.Items())
		if items == nil {
			return nil
		}
		return func(v any) any {
			if a, ok := v.([]any); ok {
				for i := range a {
					a[i] = items(a[i])
				}
			}
			return v
		}
	case *avro.MapSchema:
		values := b.build(t.Values())
		if values == nil {
			return nil
		}
		return func(v any) any {
			if m, ok := v.(map[string]any); ok {
				for k, x := range m {
					m[k] = values(x)
				}
			}
			return v
		}
	case *avro.UnionSchema:
		return b.union(t)
	case *avro.PrimitiveSchema:
		if isPlainBytes(t) {
			return clipBytes
		}
	}
	return nil
}

// isPlainBytes reports whether s is bytes without a logical type (a
// decimal decodes to *big.Rat).
func isPlainBytes(s avro.Schema) bool {
	p, ok := deref(s).(*avro.PrimitiveSchema)
	return ok && p.Type() == avro.Bytes && p.Logical() == nil
}

// clipBytes caps a decoded []byte at its length. hamba/avro carves short
// bytes and strings out of one shared slab, so a []byte it returns has
// spare capacity running into the memory of strings decoded after it:
// appending to it would overwrite those strings.
func clipBytes(v any) any {
	if b, ok := v.([]byte); ok && cap(b) > len(b) {
		return b[:len(b):len(b)]
	}
	return v
}

func (b *normBuilder) record(t *avro.RecordSchema) normalizer {
	if st, ok := b.recs[t]; ok {
		if st.done {
			return st.fn
		}
		// Recursive reference: the record's normalizer is not built yet.
		return func(v any) any {
			if st.fn != nil {
				return st.fn(v)
			}
			return v
		}
	}
	st := &recState{}
	b.recs[t] = st
	type fieldNorm struct {
		name string
		fn   normalizer
	}
	var fields []fieldNorm
	for _, f := range t.Fields() {
		if fn := b.build(f.Type()); fn != nil {
			fields = append(fields, fieldNorm{f.Name(), fn})
		}
	}
	if len(fields) > 0 {
		st.fn = func(v any) any {
			m, ok := v.(map[string]any)
			if !ok {
				return v
			}
			for _, f := range fields {
				if x, ok := m[f.name]; ok {
					m[f.name] = f.fn(x)
				}
			}
			return m
		}
	}
	st.done = true
	return st.fn
}

// union mirrors hamba/avro's decoding of a union into an interface value:
// when every branch's name is known to the API's type resolver (primitives
// and their logical types), values come out plain; otherwise every non-null
// value comes out tagged as map[string]any{branchName: value}.
func (b *normBuilder) union(t *avro.UnionSchema) normalizer {
	if b.unionsJSON {
		if fn := b.jsonUnion(t); fn != nil {
			return fn
		}
	}
	tagged := false
	for _, br := range t.Types() {
		if _, err := b.api.TypeOf(unionResolutionName(br)); err != nil {
			tagged = true
			break
		}
	}
	if !tagged {
		// Plain primitives: only bytes need attention.
		for _, br := range t.Types() {
			if isPlainBytes(br) {
				return clipBytes
			}
		}
		return nil
	}
	var nonNull []avro.Schema
	for _, br := range t.Types() {
		if br.Type() != avro.Null {
			nonNull = append(nonNull, br)
		}
	}
	if len(nonNull) == 1 {
		name, inner := typeName(nonNull[0]), b.build(nonNull[0])
		return func(v any) any {
			m, ok := v.(map[string]any)
			if !ok || len(m) != 1 {
				return v
			}
			x, ok := m[name]
			if !ok {
				return v
			}
			if inner != nil {
				x = inner(x)
			}
			return x
		}
	}
	branches := map[string]normalizer{}
	for _, br := range nonNull {
		if fn := b.build(br); fn != nil {
			branches[typeName(br)] = fn
		}
	}
	if len(branches) == 0 {
		return nil
	}
	return func(v any) any {
		m, ok := v.(map[string]any)
		if !ok || len(m) != 1 {
			return v
		}
		for k, x := range m {
			if fn := branches[k]; fn != nil {
				m[k] = fn(x)
			}
		}
		return m
	}
}

// jsonUnion is the normalizer of a union with two or more non-null
// branches under UnionsAsJSON, nil for any other union. A value without a
// JSON form (a NaN) is left as it is, for whoever converts it to fail with
// a message naming its column.
func (b *normBuilder) jsonUnion(t *avro.UnionSchema) normalizer {
	nonNull := 0
	for _, br := range t.Types() {
		if br.Type() != avro.Null {
			nonNull++
		}
	}
	if nonNull < 2 {
		return nil
	}
	tagged := false
	branches := map[string]normalizer{}
	for _, br := range t.Types() {
		if _, err := b.api.TypeOf(unionResolutionName(br)); err != nil {
			tagged = true
		}
		branches[typeName(br)] = b.build(br)
	}
	return func(v any) any {
		if v == nil {
			return nil
		}
		x := v
		if m, ok := v.(map[string]any); ok && tagged && len(m) == 1 {
			for k, bv := range m {
				if fn, ok := branches[k]; ok {
					x = bv
					if fn != nil {
						x = fn(bv)
					}
				}
			}
		} else {
			x = clipBytes(x)
		}
		js, err := avrojson.Marshal(x)
		if err != nil {
			return x
		}
		return json.RawMessage(js)
	}
}

// typeName is the name hamba/avro tags a union value with: the full name of
// a named type, else the type, with ".<logicalType>" when there is one.
func typeName(s avro.Schema) string {
	s = deref(s)
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	name := string(s.Type())
	if l, ok := s.(avro.LogicalTypeSchema); ok {
		if ls := l.Logical(); ls != nil {
			name += "." + string(ls.Type())
		}
	}
	return name
}

// unionResolutionName is the name hamba/avro looks a union branch up by in
// its type resolver.
func unionResolutionName(s avro.Schema) string {
	name := typeName(s)
	switch t := deref(s).(type) {
	case *avro.MapSchema:
		name += ":" + typeName(t.Values())
	case *avro.ArraySchema:
		name += ":" + typeName(t.Items())
	}
	return name
}
