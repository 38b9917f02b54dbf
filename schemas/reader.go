package schemas

import (
	"context"
	"errors"
	"fmt"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
)

// Subjects is what ReaderSchema needs from a registry (a *sr.Client).
type Subjects interface {
	SchemaByVersion(ctx context.Context, subject string, version int) (sr.SubjectSchema, error)
}

var _ Subjects = (*sr.Client)(nil)

// ReaderSchema parses text as the reader schema; with text empty it uses
// the latest schema registered under subject.
func ReaderSchema(ctx context.Context, reg Subjects, text, subject string) (avro.Schema, error) {
	if text == "" {
		ss, err := reg.SchemaByVersion(ctx, subject, -1)
		if err != nil {
			return nil, fmt.Errorf("latest schema of subject %q: %w", subject, err)
		}
		text = ss.Schema.Schema
	}
	s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		return nil, fmt.Errorf("reader schema: %w", err)
	}
	return s, nil
}

// Resolves reports whether events written with writer decode into reader
// as a Decoder decodes them: the same refusals (a type other than AVRO,
// references, a recursive writer, a top-level type other than a record)
// and Avro schema resolution, which also refuses a reader record whose
// name differs from the writer's unless one of its aliases is the
// writer's. Its error says what does not resolve.
func Resolves(reader avro.Schema, writer sr.Schema) error {
	if writer.Type != sr.TypeAvro {
		return fmt.Errorf("schema type %s, only AVRO is supported", writer.Type)
	}
	if len(writer.References) > 0 {
		return errors.New("schema references are not supported")
	}
	w, err := avro.ParseWithCache(writer.Schema, "", &avro.SchemaCache{})
	if err != nil {
		return fmt.Errorf("parsing writer schema: %w", err)
	}
	if isRecursive(w) {
		return errors.New("recursive writer schemas cannot be resolved")
	}
	if deref(w).Type() != avro.Record {
		return fmt.Errorf("top-level schema is %s, want a record", deref(w).Type())
	}
	if err := avro.NewSchemaCompatibility().Compatible(reader, w); err != nil {
		return err
	}
	if _, err := avro.NewSchemaCompatibility().Resolve(reader, w); err != nil {
		return err
	}
	return nil
}
