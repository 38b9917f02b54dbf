package demo

import (
	"testing"

	"github.com/hamba/avro/v2"
)

// The demo produces both schemas to one subject, so v2 must be a
// compatible evolution of v1 in both directions.
func TestSchemas(t *testing.T) {
	files, err := Schemas()
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Errorf("Schemas() has %d schemas, want 2", len(files))
	}
	parsed := map[string]avro.Schema{}
	for _, name := range []string{"account_event", "account_event_v2"} {
		s, err := avro.Parse(files[name])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if rs, ok := s.(*avro.RecordSchema); !ok || rs.FullName() != "demo.accounts.AccountEvent" {
			t.Errorf("%s: not the record demo.accounts.AccountEvent: %s", name, s.String())
		}
		parsed[name] = s
	}
	v1, v2 := parsed["account_event"], parsed["account_event_v2"]
	c := avro.NewSchemaCompatibility()
	if err := c.Compatible(v1, v2); err != nil {
		t.Errorf("v1 reader, v2 writer: %v", err)
	}
	if err := c.Compatible(v2, v1); err != nil {
		t.Errorf("v2 reader, v1 writer: %v", err)
	}
}
