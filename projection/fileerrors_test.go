package projection_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/projector-dev/projector/projection"
)

// TestParseLongNameShortError: a 10 MB name anywhere a name goes in the
// projection file (a projection, table, column, key field, field, event
// type, key of the file) is refused by its line and column in an error of
// a few hundred bytes, never echoed back whole.
func TestParseLongNameShortError(t *testing.T) {
	long := strings.Repeat("n", 10<<20)
	for _, tc := range []struct{ name, old, new, at string }{
		{"projection name", "  - name: p1\n", "  - name: " + long + "\n", "line 2, column 11"},
		{"table", "    table: tbl\n", "    table: " + long + "\n", "line 4, column 12"},
		{"key field", "    key: id\n", "    key: " + long + "\n", "line 5, column 10"},
		{"type field", "    type_field: type\n", "    type_field: " + long + "\n", "line 7, column 17"},
		// A plain key is at most 1024 characters in YAML; an explicit one
		// (? key) has no bound.
		{"column name", "      name: {type: text}\n", "      ? " + long + "\n      : {type: text}\n", "line 10, column 9"},
		{"plain key", "      name: {type: text}\n", "      " + long + ": {type: text}\n", "line 10"},
		{"column type", "      name: {type: text}\n", "      name: {type: " + long + "}\n", "line 10, column 20"},
		{"event type", "      Created: {set: {name: name}}\n", "      ? " + long + "\n      : {set: {name: name}}\n", "line 13, column 9"},
		{"field set from", "      Created: {set: {name: name}}\n", "      Created: {set: {name: " + long + "}}\n", "line 13, column 29"},
		{"unknown key", "    mode: fold\n", "    mode: fold\n    ? " + long + "\n    : 1\n", "line 7, column 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := projection.Parse([]byte(edit(t, baseYAML, tc.old, tc.new)), ".")
			if err == nil {
				t.Fatal("Parse accepted a 10 MB name")
			}
			msg := err.Error()
			if len(msg) > 1000 {
				t.Fatalf("the error is %d bytes long: %.300s…", len(msg), msg)
			}
			if strings.Contains(msg, strings.Repeat("n", 300)) {
				t.Errorf("the error quotes the name beyond a clip: %s", msg)
			}
			if !strings.Contains(msg, tc.at) {
				t.Errorf("the error does not point at %s: %s", tc.at, msg)
			}
		})
	}
	// Where a name is not expected, such as a text column's default, a
	// long value is the file's business.
	text := edit(t, baseYAML, "      name: {type: text}\n", "      name: {type: text, default: '"+strings.Repeat("d", 1000)+"'}\n")
	if _, err := projection.Parse([]byte(text), "."); err != nil {
		t.Errorf("a 1000-byte default refused: %.300s", err)
	}
}

// TestLoadNotAProjectionFile: --config pointed at a file that is not a
// projection file (a passwd file, a password file, YAML of the wrong
// shape) fails with the file's name, a line and column and what was
// wanted, and quotes none of the file.
func TestLoadNotAProjectionFile(t *testing.T) {
	const pass = "S3cret"
	dir := t.TempDir()
	pos := regexp.MustCompile(`line \d+, column \d+: `)
	for name, tc := range map[string]struct{ text, want string }{
		"passwd":     {"root:x:0:0:root:/root:/bin/bash\nbin:x:2:2:bin:/bin:/usr/sbin/nologin\n", "line 1, column 1: want a mapping with projections"},
		"pgpass":     {"db.example:5432:app:app:" + pass + "\n", "line 1, column 1: want a mapping"},
		"env":        {"PASSWORD=" + pass + "\n", "line 1, column 1: want a mapping"},
		"a list":     {"projections: password=" + pass + "\n", "line 1, column 14: projections: want a list"},
		"misspelt":   {"projections:\n  - name: a\n    pasword: " + pass + "\n", `line 3, column 5: unknown field "pasword" (want name, topic`},
		"wrong type": {"projections:\n  - name: a\n    topic: [" + pass + "]\n", "line 3, column 12: topic: want a string, got a list"},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name)
			if err := os.WriteFile(path, []byte(tc.text), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := projection.Load(path)
			if err == nil {
				t.Fatal("loaded")
			}
			msg := err.Error()
			if !strings.Contains(msg, path) || !pos.MatchString(msg) || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q does not name the file and say %q", msg, tc.want)
			}
			if strings.Contains(msg, pass) {
				t.Errorf("error %q quotes the password", msg)
			}
			for _, line := range strings.Split(tc.text, "\n") {
				if len(line) > 3 && strings.Contains(msg, line) || len(line) > 7 && !strings.HasPrefix(line, "projections:") && strings.Contains(msg, line[:7]) {
					t.Errorf("error %q quotes the file's line %q", msg, line)
				}
			}
		})
	}
}
