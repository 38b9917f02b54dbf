package partition

import (
	"context"
	"strings"
	"testing"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// fieldsDecoder decodes every value into the same fields.
type fieldsDecoder map[string]any

func (d fieldsDecoder) Decode(context.Context, []byte) (map[string]any, int, error) {
	return d, 1, nil
}

// TestDecodeChecksTheRecordKey: an event applies to the aggregate its key
// field names only when its record key is that aggregate's id as text; a
// tombstone names its aggregate by its record key alone.
func TestDecodeChecksTheRecordKey(t *testing.T) {
	p := &projection.Projection{KeyField: "id", VersionField: "version"}
	for _, tc := range []struct {
		name      string
		recordKey []byte
		id        any // the key field's value; nil: a tombstone
		class     string
		key       string
	}{
		{"same string", []byte("acc-1"), "acc-1", "", "acc-1"},
		{"other string", []byte("acc-2"), "acc-1", sinks.ClassKeyMismatch, ""},
		{"no record key", nil, "acc-1", sinks.ClassKeyMismatch, ""},
		{"empty record key", []byte{}, "acc-1", sinks.ClassKeyMismatch, ""},
		{"long as its digits", []byte("42"), int64(42), "", "42"},
		{"long as big-endian bytes", []byte{0, 0, 0, 0, 0, 0, 0, 42}, int64(42), sinks.ClassKeyMismatch, ""},
		{"same bytes", []byte{0xff, 0x00}, []byte{0xff, 0x00}, "", "\xff\x00"},
		{"tombstone", []byte("acc-1"), nil, "", "acc-1"},
		{"tombstone without a key", nil, nil, sinks.ClassInvalid, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &lane{w: &Worker{}, proj: p, dec: fieldsDecoder{"id": tc.id, "version": int64(1)}}
			it := &item{recordKey: tc.recordKey, value: []byte("a value"), tombstone: tc.id == nil}
			if it.tombstone {
				it.value = nil
			}
			if err := l.decodeAll(t.Context(), []*item{it}); err != nil {
				t.Fatal(err)
			}
			if it.class != tc.class {
				t.Errorf("class %q (error %v), want %q", it.class, it.err, tc.class)
			}
			if tc.class == "" && it.key != tc.key {
				t.Errorf("aggregate %q, want %q", it.key, tc.key)
			}
			if tc.class == sinks.ClassKeyMismatch && !strings.Contains(it.err.Error(), `"id"`) {
				t.Errorf("error %q does not name the key field", it.err)
			}
		})
	}
}
