package projector

import (
	"context"
	"fmt"

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
	return func(p *projection.Projection) partition.Decoder {
		// New calls this once the projection has its defaults, which
		// name the fields it reads.
		return schemas.NewDecoder(registry, schemas.Prune(readers[p.Name], p.ReadFields()), DecodeOptions(p)...)
	}, nil
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
