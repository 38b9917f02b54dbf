package bench

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"

	"github.com/projector-dev/projector/internal/avrojson"
)

// connectSchema is a Connect schema as JsonConverter writes and reads it.
type connectSchema struct {
	Type     string          `json:"type"`
	Name     string          `json:"name"`
	Version  int             `json:"version"`
	Optional bool            `json:"optional"`
	Field    string          `json:"field"`
	Fields   []connectSchema `json:"fields"`
}

type connectEnvelope struct {
	Schema  connectSchema   `json:"schema"`
	Payload json.RawMessage `json:"payload"`
}

// TestConnectValueCarriesTheEvent checks that the JsonConverter envelopes
// parse as JSON, that the value schema has WriterSchema's fields in its
// order with Connect's types, and that every payload holds its event with
// the padding the Avro value of the same event gets.
func TestConnectValueCarriesTheEvent(t *testing.T) {
	recs, err := Generate(GenOptions{Events: 2000, Aggregates: 50, CloseEvery: 5, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	writer, err := avro.Parse(WriterSchema)
	if err != nil {
		t.Fatal(err)
	}
	connectType := map[string]string{"account_id": "string", "version": "int64", "type": "string", "owner": "string",
		"amount": "int64", "occurred_at": "int64", "padding": "string"}
	var scratch []byte
	for _, size := range []int{0, 60, 200, 1000} {
		for i, r := range recs[:300] {
			var val []byte
			val, scratch = appendConnectValue(nil, scratch, r.Event, size)
			var env connectEnvelope
			if err := json.Unmarshal(val, &env); err != nil {
				t.Fatalf("value %d: %v\n%s", i, err, val)
			}
			s := env.Schema
			if s.Type != "struct" || s.Optional || len(s.Fields) != len(writer.(*avro.RecordSchema).Fields()) {
				t.Fatalf("value schema %+v: want a required struct of WriterSchema's fields", s)
			}
			for j, f := range writer.(*avro.RecordSchema).Fields() {
				got := s.Fields[j]
				if got.Field != f.Name() || got.Type != connectType[f.Name()] || got.Optional != (f.Name() == "owner") {
					t.Fatalf("field %d: %+v, want %s %s", j, got, f.Name(), connectType[f.Name()])
				}
			}
			if ts := s.Fields[5]; ts.Name != "org.apache.kafka.connect.data.Timestamp" || ts.Version != 1 {
				t.Fatalf("occurred_at: %+v, want the Timestamp logical type", ts)
			}
			var p struct {
				AccountID  string  `json:"account_id"`
				Version    int64   `json:"version"`
				Type       string  `json:"type"`
				Owner      *string `json:"owner"`
				Amount     int64   `json:"amount"`
				OccurredAt int64   `json:"occurred_at"`
				Padding    string  `json:"padding"`
			}
			if err := json.Unmarshal(env.Payload, &p); err != nil {
				t.Fatal(err)
			}
			ev := r.Event
			if p.AccountID != ev.AccountID || p.Version != ev.Version || p.Type != ev.Type || p.Amount != ev.Amount ||
				p.OccurredAt != ev.OccurredAt.UnixMilli() || (p.Owner == nil) != (ev.Owner == "") || (p.Owner != nil && *p.Owner != ev.Owner) {
				t.Fatalf("payload %+v, want %+v", p, ev)
			}
			avroLen := len(AppendValue(nil, 1, ev, size))
			unpadded := len(appendUnpadded(nil, 1, ev)) + 1
			wantPad := avroLen - unpadded
			if wantPad >= 64 {
				wantPad--
			}
			if len(p.Padding) != wantPad || !strings.HasPrefix(filler, p.Padding) {
				t.Fatalf("size %d: padding of %d bytes, want the Avro value's %d", size, len(p.Padding), wantPad)
			}
		}
	}
	var env connectEnvelope
	if err := json.Unmarshal(appendConnectKey(nil, "acc-0000042"), &env); err != nil {
		t.Fatal(err)
	}
	if f := env.Schema.Fields; env.Schema.Type != "struct" || len(f) != 1 || f[0].Field != "account_id" || f[0].Type != "string" ||
		string(env.Payload) != `{"account_id":"acc-0000042"}` {
		t.Fatalf("key envelope %+v %s", env.Schema, env.Payload)
	}
}

// TestAppendJSONString checks the string encoder against encoding/json.
func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "acc-0000001", `a "quoted" \ path`, "tab\tline\nreturn\r", "\x00\x1f\x7f", "héllo €", "bad \xff utf-8", "<&>"} {
		var got string
		if err := json.Unmarshal(avrojson.AppendString(nil, s), &got); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		want, _ := json.Marshal(s)
		var wantS string
		_ = json.Unmarshal(want, &wantS)
		if got != wantS {
			t.Fatalf("%q: decoded as %q, want %q", s, got, wantS)
		}
	}
}
