package projection_test

import (
	"errors"
	"testing"

	"github.com/hamba/avro/v2"

	"github.com/projector-dev/projector/projection"
)

// TestAccepts follows the mapping table type by type: what each Avro
// type may fill, and what it may not.
func TestAccepts(t *testing.T) {
	for _, tc := range []struct {
		avro string
		ok   []string
		no   []string
	}{
		{`"boolean"`, []string{"boolean", "bool", "text"}, []string{"bigint", "jsonb"}},
		{`"long"`, []string{"bigint", "int8", "integer", "smallint", "numeric(10,2)", "real", "double precision", "text", "varchar(20)"}, []string{"boolean", "timestamptz", "bytea"}},
		{`"int"`, []string{"integer", "bigint"}, []string{"uuid"}},
		{`"double"`, []string{"double precision", "float8", "real", "numeric", "text"}, []string{"bigint", "integer"}},
		{`"string"`, []string{"text", "uuid", "inet", "date", "timestamptz", "numeric", "jsonb", "citext", "mood", "text[]"}, nil},
		{`{"type": "array", "items": {"type": "array", "items": "long"}}`, []string{"bigint[]", "integer[][]", "jsonb"}, []string{"bigint", "boolean[]"}},
		{`{"type": "array", "items": {"type": "record", "name": "item", "fields": [{"name": "a", "type": "long"}]}}`, []string{"jsonb[]", "jsonb"}, []string{"text[]"}},
		{`["null", "string", "long"]`, []string{"jsonb", "text", "json", "bigint"}, []string{"bigint[]"}},
		{`["long", "double"]`, []string{"double precision", "numeric", "text"}, []string{"bigint", "boolean"}},
		{`{"type": "array", "items": {"type": "enum", "name": "E2", "symbols": ["A"]}}`, []string{"text[]", "mood[]"}, []string{"bigint[]"}},
		{`["string", {"type": "record", "name": "rb", "fields": [{"name": "a", "type": "long"}]}]`, []string{"jsonb", "text"}, []string{"bigint", "text[]"}},
		{`"bytes"`, []string{"bytea"}, []string{"text", "jsonb"}},
		{`{"type": "fixed", "name": "f", "size": 4}`, []string{"bytea"}, []string{"text"}},
		{`{"type": "enum", "name": "e", "symbols": ["A"]}`, []string{"text", "character varying(10)", "citext", "mood"}, []string{"bigint", "jsonb", "boolean"}},
		{`{"type": "array", "items": "string"}`, []string{"text[]", "jsonb", "json", "uuid[]"}, []string{"text"}},
		{`{"type": "array", "items": "long"}`, []string{"bigint[]", "integer[]", "double precision[]", "jsonb"}, []string{"boolean[]"}},
		{`{"type": "array", "items": {"type": "long", "logicalType": "timestamp-millis"}}`, []string{"timestamptz[]", "timestamp with time zone[]"}, []string{"date[]"}},
		{`{"type": "map", "values": "long"}`, []string{"jsonb", "json"}, []string{"text", "bigint[]"}},
		{`{"type": "record", "name": "r", "fields": [{"name": "a", "type": "long"}]}`, []string{"jsonb", "json"}, []string{"text", "bigint"}},
		{`["null", "long"]`, []string{"bigint", "text"}, []string{"boolean"}},
		{`{"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}`, []string{"numeric", "numeric(12,2)", "text"}, []string{"bytea", "double precision"}},
		{`{"type": "long", "logicalType": "timestamp-millis"}`, []string{"timestamptz", "timestamp(3) with time zone", "timestamp", "text"}, []string{"bigint", "date"}},
		{`{"type": "long", "logicalType": "timestamp-micros"}`, []string{"timestamp with time zone"}, []string{"time"}},
		{`{"type": "long", "logicalType": "local-timestamp-millis"}`, []string{"timestamp", "timestamp without time zone", "text"}, []string{"timestamptz"}},
		{`{"type": "int", "logicalType": "date"}`, []string{"date", "text"}, []string{"integer", "timestamptz"}},
		{`{"type": "int", "logicalType": "time-millis"}`, []string{"time", "text"}, []string{"integer"}},
		{`{"type": "string", "logicalType": "uuid"}`, []string{"uuid", "text"}, []string{"bigint"}},
	} {
		s, err := avro.ParseWithCache(tc.avro, "", &avro.SchemaCache{})
		if err != nil {
			t.Fatalf("%s: %v", tc.avro, err)
		}
		for _, pg := range tc.ok {
			if err := projection.Accepts(pg, s); err != nil {
				t.Errorf("Accepts(%s, %s) = %v, want nil", pg, tc.avro, err)
			}
		}
		for _, pg := range tc.no {
			err := projection.Accepts(pg, s)
			if !errors.Is(err, projection.ErrNotAccepted) {
				t.Errorf("Accepts(%s, %s) = %v, want ErrNotAccepted", pg, tc.avro, err)
			}
		}
	}
}
