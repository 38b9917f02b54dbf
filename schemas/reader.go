package schemas

import (
	"context"
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
