package schemafile_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/schemafile"
)

// hint is the example every error ends with.
const hint = `want an Avro schema in JSON, such as {"type": "record", "name": …, "fields": […]}`

// TestParseNeverQuotesTheFile: whatever the file holds, the error says
// where (line, column) and what was wanted, and quotes none of it.
func TestParseNeverQuotesTheFile(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		line, col  int
		problem    string
	}{
		{"passwd", "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n", 1, 1, "not JSON"},
		{"pgpass", "db.example:5432:app:app:S3cret\n", 1, 1, "not JSON"},
		{"key=value", "# settings\npassword=S3cret\n", 1, 1, "not JSON"},
		{"cut short", "{\n  \"type\": \"record\",\n", 3, 1, "ends too early"},
		{"bad character on line 3", "{\"type\": \"record\",\n \"name\": \"A\",\n \"fields\": [S3cret]}", 3, 13, "not JSON"},
		{"a JSON string naming no type", `"password=S3cret"`, 1, 1, "neither a primitive type"},
		{"unknown field type", "{\"type\": \"record\", \"name\": \"A\",\n \"fields\": [\n  {\"name\": \"a\", \"type\": \"S3cretType\"}]}", 3, 25, "neither a primitive type"},
		{"invalid name", "{\"type\": \"record\",\n  \"name\": \"S3cret-name\", \"fields\": []}", 2, 11, "not an Avro name"},
		{"no fields", "{\"type\": \"record\", \"name\": \"S3cret\"}", 1, 10, "without a fields array"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := schemafile.Parse([]byte(tc.text))
			if err == nil {
				t.Fatal("parsed")
			}
			var fe *schemafile.Error
			if !errors.As(err, &fe) || !errors.Is(err, schemafile.ErrNotSchema) {
				t.Fatalf("error %v (%T) is not a *schemafile.Error", err, err)
			}
			if fe.Line != tc.line || fe.Column != tc.col {
				t.Errorf("at line %d, column %d, want line %d, column %d", fe.Line, fe.Column, tc.line, tc.col)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.problem) || !strings.Contains(msg, "want an Avro schema") {
				t.Errorf("error %q does not say %q and what was wanted", msg, tc.problem)
			}
			if strings.Contains(msg, "S3cret") {
				t.Errorf("error %q quotes the file", msg)
			}
			for _, line := range strings.Split(tc.text, "\n") {
				if len(line) > 3 && strings.Contains(msg, line) && !strings.Contains(hint, line) {
					t.Errorf("error %q quotes the file's line %q", msg, line)
				}
			}
		})
	}
}

func TestParseReadsASchema(t *testing.T) {
	s, err := schemafile.Parse([]byte(`{"type": "record", "name": "A", "fields": [{"name": "a", "type": "string"}]}`))
	if err != nil || s.Type() != "record" {
		t.Fatalf("Parse = %v, %v", s, err)
	}
	// A schema that names a type defined by another parse is still one
	// it does not know: each parse has a cache of its own.
	if _, err := schemafile.Parse([]byte(`"A"`)); err == nil {
		t.Error("a name defined by another parse resolved")
	}
}

func TestReadRefusesAHugeFile(t *testing.T) {
	_, _, err := schemafile.Read(bytes.NewReader(bytes.Repeat([]byte("x"), schemafile.MaxSize+1)))
	if !errors.Is(err, schemafile.ErrNotSchema) || len(err.Error()) > 200 {
		t.Fatalf("Read = %v", err)
	}
}
