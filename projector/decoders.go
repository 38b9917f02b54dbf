package projector

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/schemas"
)

// RegistryDecoders returns the decoders projector run uses: each of ps
// decodes its events (Avro in the Confluent wire format, writer schemas
// from registry) into its reader schema, its Schema or else the latest
// registered under "<topic>-value", which is read now, and only the fields
// its fold reads.
func RegistryDecoders(ctx context.Context, registry *sr.Client, ps ...*projection.Projection) (Decoders, error) {
	readers := make(map[string]avro.Schema, len(ps))
	for _, p := range ps {
		r, err := schemas.ReaderSchema(ctx, registry, p.Schema, p.Topic+"-value")
		if err != nil {
			return nil, fmt.Errorf("projection %q: reader schema: %w", p.Name, err)
		}
		readers[p.Name] = r
	}
	return PrunedDecoders(registry, readers), nil
}

// PrunedDecoders returns decoders into each projection's reader schema
// (readers, by projection name) cut to the fields its fold reads.
// Projections of one topic whose cut schemas are the same get one
// decoder: a worker running them decodes each record once for all.
func PrunedDecoders(registry schemas.Registry, readers map[string]avro.Schema) Decoders {
	var mu sync.Mutex
	byReader := map[string]*schemas.Decoder{}
	return func(p *projection.Projection) partition.Decoder {
		// New calls this once the projection has its defaults, which
		// name the fields it reads.
		reader := schemas.Prune(readers[p.Name], p.ReadFields())
		// The options follow from whether the fold reads maps (see
		// DecodeOptions), so they are part of the key.
		key := fmt.Sprintf("%s\x00%v\x00%s", p.Topic, p.ReadsFieldsMap(), reader.String())
		mu.Lock()
		defer mu.Unlock()
		if d := byReader[key]; d != nil {
			return d
		}
		d := schemas.NewDecoder(registry, reader, DecodeOptions(p)...)
		byReader[key] = d
		return d
	}
}

// DecodeOptions are the decoder options projection p is decoded with: a
// projection compiled from a file takes a union of several non-null
// branches as JSON (the columns it fills are json or jsonb, see
// schemas.UnionsAsJSON); a Go fold gets such unions as schemas.Decoder
// documents them.
func DecodeOptions(p *projection.Projection) []schemas.Option {
	if p.ReadsFieldsMap() {
		return nil
	}
	return []schemas.Option{schemas.UnionsAsJSON()}
}

// ClassifyDecode tells the partition workers how to treat a decode error
// of package schemas: malformed or undecodable values and schemas the
// projection cannot read are terminal, an unknown schema id is retried up
// to the attempt limit (it may be registered late), anything else (the
// registry unreachable) is transient.
func ClassifyDecode(err error) partition.Class {
	switch {
	case errors.Is(err, schemas.ErrUnknownSchema):
		return partition.Retryable
	case schemas.IsTerminal(err):
		return partition.Terminal
	}
	return partition.Transient
}
