package demo

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"strings"
)

// schemaFiles holds the demo domain's Avro schemas: v1 of AccountEvent and
// its compatible evolution v2.
//
//go:embed *.avsc
var schemaFiles embed.FS

// Schemas returns the demo's Avro schemas keyed by file base name without
// the .avsc extension ("account_event", "account_event_v2").
func Schemas() (map[string]string, error) {
	names, err := fs.Glob(schemaFiles, "*.avsc")
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(names))
	for _, name := range names {
		b, err := schemaFiles.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("read demo schema %s: %w", name, err)
		}
		out[strings.TrimSuffix(path.Base(name), ".avsc")] = string(b)
	}
	return out, nil
}
