package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/asyncapi"
	"github.com/projector-dev/projector/projection"
)

type asyncapiFlags struct {
	common
	output          string
	format          string
	contractVersion string
}

func asyncapiCommand(stdout, stderr io.Writer) *ffcli.Command {
	f := &asyncapiFlags{}
	return newCommand("asyncapi", "projector asyncapi --config FILE [--registry-url URL] [--identity ID] [--output FILE] [--format yaml|json]",
		"Write the AsyncAPI 3.0 contract of the topics the projection file consumes: a channel per topic, the messages with their Avro reader schemas, "+
			"the Kafka bindings (the key, the schema id in the payload), the tombstone, the CloudEvents and trace headers, and a receive operation per projection in the consumer group --identity. "+
			"A projection without schema: takes the latest schema registered under <topic>-value, from --registry-url.", stderr,
		func(fs *flag.FlagSet) {
			f.common.register(fs, "registry-url", "identity", "config")
			fs.StringVar(&f.output, "output", "", "write the document to this file instead of stdout")
			fs.StringVar(&f.format, "format", asyncapi.FormatYAML, "the document's format: yaml or json")
			fs.StringVar(&f.contractVersion, "contract-version", "1.0.0", "the contract's version, the document's info.version")
		},
		func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("unexpected arguments %q: asyncapi takes only flags", args)
			}
			return f.run(ctx, stdout)
		})
}

func (f *asyncapiFlags) run(ctx context.Context, stdout io.Writer) error {
	if f.format != asyncapi.FormatYAML && f.format != asyncapi.FormatJSON {
		return fmt.Errorf("--format %q: want yaml or json", f.format)
	}
	if f.identity == "" {
		return fmt.Errorf("--identity: want the consumer group id, got nothing")
	}
	projs, err := projection.Load(f.config)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	srcs, err := f.sources(ctx, projs)
	if err != nil {
		return err
	}
	// The whole document is written before anything is: a failure leaves
	// no half a document behind.
	var buf bytes.Buffer
	if err := asyncapi.Write(&buf, asyncapi.Config{Identity: f.identity, Version: f.contractVersion, Sources: srcs}, f.format); err != nil {
		return err
	}
	if f.output == "" {
		_, err := buf.WriteTo(stdout)
		return err
	}
	if err := os.WriteFile(f.output, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("--output: %w", err)
	}
	return nil
}

// sources pairs each projection with its reader schema: its schema: file,
// else the latest registered under its topic's value subject.
func (f *asyncapiFlags) sources(ctx context.Context, projs []*projection.Projection) ([]asyncapi.Source, error) {
	var reg *sr.Client
	out := make([]asyncapi.Source, 0, len(projs))
	for _, p := range projs {
		if p.Schema != "" {
			out = append(out, asyncapi.Source{Projection: p, Reader: p.Schema, ReaderFrom: "the projection file's schema " + p.SchemaFile})
			continue
		}
		subject := p.Topic + "-value"
		if f.registryURL == "" {
			return nil, fmt.Errorf("--registry-url (PROJECTOR_REGISTRY_URL) is required: projection %q has no schema: file, so its reader schema is the latest registered under %q", p.Name, subject)
		}
		if reg == nil {
			var err error
			if reg, err = f.registryClient(); err != nil {
				return nil, err
			}
		}
		ss, err := reg.SchemaByVersion(ctx, subject, -1)
		if err != nil {
			return nil, fmt.Errorf("projection %q: latest schema of subject %q: %w", p.Name, subject, err)
		}
		if ss.Schema.Type != sr.TypeAvro {
			return nil, fmt.Errorf("projection %q: the latest schema of subject %q is %s, want AVRO", p.Name, subject, ss.Schema.Type)
		}
		out = append(out, asyncapi.Source{Projection: p, Reader: ss.Schema.Schema, ReaderFrom: "the latest registered under subject " + subject + " when the document was written"})
	}
	return out, nil
}
