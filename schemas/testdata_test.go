package schemas

import (
	"os"
	"path/filepath"
	"strings"
)

// fixtures returns the test schemas in testdata, keyed by file base name
// without the .avsc extension: AccountEvent v1 ("account_event") and its
// compatible evolution v2 ("account_event_v2"). They are the decoder's
// fixtures, kept here so that the decoder's tests do not move when the
// demo's own schemas do.
func fixtures() (map[string]string, error) {
	names, err := filepath.Glob(filepath.Join("testdata", "*.avsc"))
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(names))
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		out[strings.TrimSuffix(filepath.Base(name), ".avsc")] = string(b)
	}
	return out, nil
}
