package schemas

import (
	"embed"
	"io/fs"
	"path"
	"strings"
)

// Files holds the demo domain's Avro schemas (*.avsc).
//
//go:embed *.avsc
var Files embed.FS

// Demo returns the demo schemas keyed by file base name without the .avsc
// extension (for example "account_event" and "account_event_v2") mapped to
// the schema text.
func Demo() (map[string]string, error) {
	names, err := fs.Glob(Files, "*.avsc")
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(names))
	for _, name := range names {
		b, err := Files.ReadFile(name)
		if err != nil {
			return nil, err
		}
		out[strings.TrimSuffix(path.Base(name), ".avsc")] = string(b)
	}
	return out, nil
}
