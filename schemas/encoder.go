package schemas

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
)

// encodeAPI is the hamba/avro API producers encode with, private so that
// global avro.Register calls elsewhere cannot change the encoding.
var encodeAPI = avro.Config{}.Freeze()

// AppendWire appends the Confluent wire format of v (encoded with schema)
// under schema id to dst: magic byte 0, id as 4 bytes big-endian, then the
// Avro binary encoding of v. v is typically a map[string]any keyed by field
// name (or a struct with avro tags); a timestamp-millis field takes a
// time.Time, a ["null", T] union field takes nil or a T. On error dst is
// returned unchanged.
func AppendWire(dst []byte, id int, schema avro.Schema, v any) ([]byte, error) {
	if id < 0 || id > math.MaxInt32 {
		return dst, fmt.Errorf("schema id %d out of range", id)
	}
	if schema == nil {
		return dst, fmt.Errorf("schema id %d: nil schema", id)
	}
	body, err := encodeAPI.Marshal(schema, v)
	if err != nil {
		return dst, fmt.Errorf("schema id %d: encoding: %w", id, err)
	}
	dst = append(dst, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(id))
	return append(dst, body...), nil
}

// Register registers every schema text (Avro) under subject, in the given
// order, with the client's CreateSchema, and returns their ids in the same
// order. Registering a text the subject already has returns its existing id.
// It stops at the first failure, returning the ids registered so far.
func Register(ctx context.Context, cl *sr.Client, subject string, texts ...string) ([]int, error) {
	ids := make([]int, 0, len(texts))
	for i, text := range texts {
		ss, err := cl.CreateSchema(ctx, subject, sr.Schema{Schema: text, Type: sr.TypeAvro})
		if err != nil {
			return ids, fmt.Errorf("registering schema %d of %d under %q: %w", i+1, len(texts), subject, err)
		}
		ids = append(ids, ss.ID)
	}
	return ids, nil
}
