package partition

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// Decoder turns a record value into the projection's reader schema.
type Decoder interface {
	Decode(ctx context.Context, value []byte) (map[string]any, int, error)
}

// ValuesDecoder is a Decoder that can also write a record's fields into
// values the caller provides, Width of them, in the order of the names it
// returns (a *schemas.Decoder with a reader schema); a record it cannot
// decode so it returns as a map, names nil. A worker whose projection's
// fold reads events through projection.Event.Field decodes batches with
// it: one slice for a batch's values instead of a map per event.
type ValuesDecoder interface {
	Decoder
	Width() int
	DecodeValues(ctx context.Context, value []byte, vals []any) (names []string, rec map[string]any, id int, err error)
}

// Class is how an error is handled.
type Class uint8

const (
	// Transient: infrastructure is unavailable; retry without limit, never
	// dead-letter.
	Transient Class = iota
	// Retryable: may succeed later; retry up to MaxAttempts, then
	// dead-letter.
	Retryable
	// Terminal: retrying cannot help; dead-letter now.
	Terminal
)

// item is one record of a batch, decoded, or one restored parked event.
type item struct {
	offset    int64
	recordKey []byte
	value     []byte
	headers   []sinks.Header
	timestamp time.Time
	replayOf  int64 // dead letter this record replays, 0: none

	key     string
	agg     int // the key's index in the batch's Keys.All (see batchKeys)
	version int64
	typ     string
	fields  map[string]any
	// The record decoded into values (see ValuesDecoder), names nil
	// otherwise.
	names     []string
	values    []any
	schemaID  int
	tombstone bool
	restored  bool // parked in an earlier batch

	// A failed item is dead-lettered.
	err      error
	class    string
	attempts int
}

// batchMemory is where a batch's items and their decoded values are
// made: one allocation each for the batch. A worker that is behind plans
// batch after batch and keeps none of their items once planned (what it
// keeps is copied out: rows, parked events, dead letters), so it makes
// them in the same memory every time (see lane.planBatch).
type batchMemory struct {
	ptrs   []*item
	items  []item
	values []any
}

// take returns room for n items with width values each, reusing what m
// holds. The items are zeroed by recordItem; values are written by
// decoding before they are read.
func (m *batchMemory) take(n, width int) (ptrs []*item, items []item, values []any) {
	if cap(m.items) < n {
		m.ptrs, m.items = make([]*item, 0, n), make([]item, n)
	}
	if cap(m.values) < n*width {
		m.values = make([]any, n*width)
	}
	return m.ptrs[:0], m.items[:n], m.values[:n*width]
}

func (it *item) fail(class string, err error) {
	it.class, it.err = class, err
}

// event is the item's event at version v.
func (it *item) event(v int64) projection.Event {
	if it.names != nil {
		return projection.NewEvent(it.key, v, it.typ, it.names, it.values)
	}
	return projection.Event{Key: it.key, Version: v, Type: it.typ, Fields: it.fields}
}

// decoded reports whether the item's record has been decoded.
func (it *item) decoded() bool { return it.fields != nil || it.names != nil }

// recordItem fills it with what r carries.
func recordItem(it *item, r *kgo.Record) {
	*it = item{offset: r.Offset, recordKey: r.Key, value: r.Value, timestamp: r.Timestamp, tombstone: r.Value == nil}
	if len(r.Headers) > 0 {
		it.headers = make([]sinks.Header, len(r.Headers))
		for i, h := range r.Headers {
			it.headers[i] = sinks.Header{Key: h.Key, Value: h.Value}
			if h.Key == sinks.ReplayHeader {
				it.replayOf, _ = strconv.ParseInt(string(h.Value), 10, 64)
			}
		}
	}
}

// items returns the decoded items of the records from offset start on
// (those before it are committed) and the offset after the last record,
// made in mem (nil: in new memory).
func (l *lane) items(ctx context.Context, recs []*kgo.Record, start int64, mem *batchMemory) ([]*item, int64, error) {
	if mem == nil {
		mem = &batchMemory{}
	}
	w := l.w
	width := 0
	if l.values != nil {
		width = l.values.Width()
	}
	items, slab, values := mem.take(len(recs), width)
	for i, r := range recs {
		if r.Offset < start || r.Attrs.IsControl() {
			continue // already committed, or a transaction marker
		}
		recordItem(&slab[i], r)
		if width > 0 {
			slab[i].values = values[i*width : (i+1)*width : (i+1)*width]
		}
		items = append(items, &slab[i])
	}
	end := recs[len(recs)-1].Offset + 1
	if end <= start {
		return nil, end, nil
	}
	for _, it := range items {
		if len(it.value) > w.cfg.MaxRecordBytes {
			it.fail(sinks.ClassOversized, fmt.Errorf("value of %d bytes is over the %d-byte limit", len(it.value), w.cfg.MaxRecordBytes))
		}
		if err := checkKey(it.recordKey, w.cfg.MaxKeyBytes); err != nil {
			it.fail(sinks.ClassInvalidKey, err)
		}
	}
	if r := w.refusal; r != nil {
		r.mark(items)
	}
	return items, end, l.decodeAll(ctx, items)
}

// checkKey reports why a record key cannot be an aggregate's key: a
// record's aggregate key is its record key (see extract), which
// projector's tables keep as text and index (the projection's primary
// key, parked events, tombstones). Text holds valid UTF-8 without NUL;
// an index entry at most about 2,700 bytes, and max (negative: no limit)
// keeps keys well below that.
func checkKey(key []byte, max int) error {
	if max >= 0 && len(key) > max {
		return fmt.Errorf("record key of %d bytes is over the %d-byte key limit: %q", len(key), max, clip(string(key)))
	}
	if i := bytes.IndexByte(key, 0); i >= 0 {
		return fmt.Errorf("record key %q has a NUL byte at %d, which Postgres text cannot hold", clip(string(key)), i)
	}
	if !utf8.Valid(key) {
		return fmt.Errorf("record key %q is not valid UTF-8, which Postgres text must be", clip(string(key)))
	}
	return nil
}

// decodeAll decodes every item that needs it. Terminal failures stay in
// the item; records whose schema may yet appear are retried up to
// MaxAttempts; an unreachable registry is retried without limit.
func (l *lane) decodeAll(ctx context.Context, items []*item) error {
	w := l.w
	for _, it := range items {
		if it.tombstone && it.err == nil {
			keyTombstone(it) // nothing to decode or retry: its key is the record's
		}
	}
	retries := 0
	for attempt := 0; ; attempt++ {
		var again []*item
		var cause error
		for _, it := range items {
			if it.err != nil || it.decoded() || it.tombstone {
				continue
			}
			err := l.decode(ctx, it)
			if err == nil {
				continue
			}
			switch w.cfg.ClassifyDecode(err) {
			case Terminal:
				it.fail(sinks.ClassDecode, fmt.Errorf("decode: %w", err))
			case Retryable:
				it.attempts = retries + 1
				if retries+1 >= w.cfg.MaxAttempts {
					it.fail(sinks.ClassDecode, fmt.Errorf("decode, after %d attempts: %w", retries+1, err))
				} else {
					again = append(again, it)
					cause = err
				}
			default:
				again = append(again, it)
				cause = err
			}
		}
		if len(again) == 0 {
			if attempt > 0 {
				w.done()
			}
			return nil
		}
		if w.cfg.ClassifyDecode(cause) == Retryable {
			retries++
		}
		if err := w.backoff(ctx, attempt, fmt.Sprintf("decode %d records", len(again)), cause); err != nil {
			return err
		}
	}
}

// decode fills the item's aggregate key, version and fields. A decode
// error is returned for the caller to classify; a decoded record without a
// usable key or version fails the item.
func (l *lane) decode(ctx context.Context, it *item) error {
	if it.tombstone {
		keyTombstone(it)
		return nil
	}
	var (
		id  int
		err error
	)
	if l.values != nil {
		if it.values == nil { // not of a batch (a parked event)
			it.values = make([]any, l.values.Width())
		}
		it.names, it.fields, id, err = l.values.DecodeValues(ctx, it.value, it.values)
	} else {
		it.fields, id, err = l.dec.Decode(ctx, it.value)
	}
	it.schemaID = id
	if err != nil {
		return err
	}
	l.extract(it)
	return nil
}

// extract fills the decoded item's aggregate key, version and type from
// the fields the projection names; a record without usable ones fails
// the item.
func (l *lane) extract(it *item) {
	p := l.proj
	ev := it.event(0)
	field := func(name string) any {
		v, _ := ev.Field(name)
		return v
	}
	switch k := field(p.KeyField).(type) {
	case string:
		it.key = k
	case nil:
		it.fail(sinks.ClassInvalid, fmt.Errorf("key field %q is missing or null", p.KeyField))
		return
	case []byte:
		it.key = string(k)
	default:
		it.key = fmt.Sprint(k)
	}
	if string(it.recordKey) != it.key {
		it.fail(sinks.ClassKeyMismatch, fmt.Errorf("record key %q is not %q, the aggregate key field %q names: the record's partition does not own that aggregate",
			clip(string(it.recordKey)), clip(it.key), p.KeyField))
		return
	}
	switch v := field(p.VersionField).(type) {
	case int64:
		it.version = v
	case int32:
		it.version = int64(v)
	case int:
		it.version = int64(v)
	default:
		it.fail(sinks.ClassInvalid, fmt.Errorf("version field %q: want a long, got %T", p.VersionField, v))
		return
	}
	if it.version < 1 {
		it.fail(sinks.ClassInvalid, fmt.Errorf("version field %q: %d is below 1", p.VersionField, it.version))
		return
	}
	if p.TypeField != "" {
		t, ok := field(p.TypeField).(string)
		if !ok {
			it.fail(sinks.ClassInvalid, fmt.Errorf("type field %q: want a string, got %T", p.TypeField, field(p.TypeField)))
			return
		}
		it.typ = t
	}
}

// keyTombstone gives a tombstone its aggregate, the one its record key
// names: it has no value to read a key field from. One without a record
// key names none, and fails.
func keyTombstone(it *item) {
	if len(it.recordKey) == 0 {
		it.fail(sinks.ClassInvalid, errors.New("tombstone without a record key"))
		return
	}
	it.key = string(it.recordKey)
}

// clip bounds a key or value quoted in an error or a log line (see
// redact.Clip).
func clip(s string) string { return redact.Clip(s) }
