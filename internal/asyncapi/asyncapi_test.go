package asyncapi

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/projector-dev/projector/projection"
)

// accountEvent is a reader schema of the accounts topic.
const accountEvent = `{"type": "record", "name": "AccountEvent", "namespace": "example", "fields": [
	{"name": "account_id", "type": "string"},
	{"name": "version", "type": "long"},
	{"name": "type", "type": "string"},
	{"name": "owner", "type": ["null", "string"], "default": null},
	{"name": "amount", "type": "long", "default": 0}
]}`

// accountEventSlim is another reader schema of the same record, without
// owner.
const accountEventSlim = `{"type": "record", "name": "AccountEvent", "namespace": "example", "fields": [
	{"name": "account_id", "type": "string"},
	{"name": "version", "type": "long"},
	{"name": "type", "type": "string"},
	{"name": "amount", "type": "long", "default": 0}
]}`

// customer is a snapshot's reader schema, keyed by a number.
const customer = `{"type": "record", "name": "Customer", "fields": [
	{"name": "customer_id", "type": "long"},
	{"name": "version", "type": "long"},
	{"name": "type", "type": "string"},
	{"name": "name", "type": "string"}
]}`

const projections = `projections:
  - name: balances
    topic: accounts
    table: balances
    key: account_id
    mode: fold
    type_field: type
    columns:
      account_id: {type: text, primary_key: true}
      balance: {type: bigint, default: 0}
    events:
      Deposited: {add: {balance: amount}}
      Withdrawn: {add: {balance: -amount}}
      AccountClosed: {delete: true}
  - name: owners
    topic: accounts
    table: owners
    key: account_id
    mode: fold
    type_field: type
    columns:
      account_id: {type: text, primary_key: true}
      owner: {type: text}
    events:
      AccountOpened: {set: {owner: owner}}
  - name: customers
    topic: customers
    table: customers
    key: customer_id
    mode: snapshot
    type_field: type
    on_gap: apply
    columns:
      customer_id: {type: bigint, primary_key: true}
      name: {type: text}
    delete_on: [CustomerErased, CustomerMerged]
`

// load parses projections and pairs them with readers, by name.
func load(t *testing.T, readers map[string]string) []Source {
	t.Helper()
	ps, err := projection.Parse([]byte(projections), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var out []Source
	for _, p := range ps {
		if r, ok := readers[p.Name]; ok {
			out = append(out, Source{Projection: p, Reader: r, ReaderFrom: p.Name + ".avsc"})
		}
	}
	return out
}

// generate writes the document of srcs and reads it back.
func generate(t *testing.T, srcs []Source) (map[string]any, []byte) {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, Config{Identity: "accounts-projector", Sources: srcs}, FormatYAML); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("the document is not YAML: %v\n%s", err, &buf)
	}
	return doc, buf.Bytes()
}

// at returns the value at the path of keys in doc.
func at(t *testing.T, doc any, keys ...string) any {
	t.Helper()
	v := doc
	for i, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s: not a mapping", strings.Join(keys[:i], "."))
		}
		if v, ok = m[k]; !ok {
			t.Fatalf("%s: no such key (have %v)", strings.Join(keys[:i+1], "."), keysOf(m))
		}
	}
	return v
}

func keysOf(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// refs lists the $ref of each operation message of name.
func refs(t *testing.T, doc map[string]any, name string) []string {
	t.Helper()
	var out []string
	for _, m := range at(t, doc, "operations", name, "messages").([]any) {
		out = append(out, m.(map[string]any)["$ref"].(string))
	}
	return out
}

// TestProjectionsOfOneTopicShareItsChannel: two projections of one topic
// are one channel with both operations; with one reader schema they read
// one message, with two each reads its own, told apart by name.
func TestProjectionsOfOneTopicShareItsChannel(t *testing.T) {
	doc, _ := generate(t, load(t, map[string]string{"balances": accountEvent, "owners": accountEvent, "customers": customer}))
	channels := at(t, doc, "channels").(map[string]any)
	if len(channels) != 2 {
		t.Fatalf("channels %v, want accounts and customers", keysOf(channels))
	}
	if got := at(t, doc, "channels", "accounts", "address"); got != "accounts" {
		t.Errorf("address %v, want the topic", got)
	}
	if got := at(t, doc, "channels", "accounts", "bindings", "kafka", "topic"); got != "accounts" {
		t.Errorf("kafka binding topic %v, want accounts", got)
	}
	msgs := at(t, doc, "channels", "accounts", "messages").(map[string]any)
	if len(msgs) != 2 || msgs["AccountEvent"] == nil || msgs["tombstone"] == nil {
		t.Fatalf("accounts messages %v, want AccountEvent and tombstone", keysOf(msgs))
	}
	want := []string{"#/channels/accounts/messages/AccountEvent", "#/channels/accounts/messages/tombstone"}
	for _, op := range []string{"balances", "owners"} {
		if got := refs(t, doc, op); !reflect.DeepEqual(got, want) {
			t.Errorf("operation %s messages %v, want %v", op, got, want)
		}
		if got := at(t, doc, "operations", op, "channel", "$ref"); got != "#/channels/accounts" {
			t.Errorf("operation %s channel %v", op, got)
		}
	}
	desc := at(t, doc, "channels", "accounts", "messages", "AccountEvent", "description").(string)
	for _, w := range []string{"Projection balances reads account_id (the aggregate id), version (the version, a long), type (the event type), amount.",
		"Projection owners reads account_id (the aggregate id), version (the version, a long), type (the event type), owner."} {
		if !strings.Contains(desc, w) {
			t.Errorf("message description\n%s\nwant %q", desc, w)
		}
	}

	doc, _ = generate(t, load(t, map[string]string{"balances": accountEventSlim, "owners": accountEvent}))
	msgs = at(t, doc, "channels", "accounts", "messages").(map[string]any)
	if len(msgs) != 3 || msgs["AccountEvent_balances"] == nil || msgs["AccountEvent_owners"] == nil {
		t.Fatalf("accounts messages %v, want AccountEvent_balances, AccountEvent_owners and tombstone", keysOf(msgs))
	}
	if got := refs(t, doc, "owners"); got[0] != "#/channels/accounts/messages/AccountEvent_owners" {
		t.Errorf("owners reads %v, want its own message", got)
	}
	fields := at(t, doc, "channels", "accounts", "messages", "AccountEvent_balances", "payload", "schema", "fields").([]any)
	if len(fields) != 4 {
		t.Errorf("balances' payload has %d fields, want its reader schema's 4", len(fields))
	}
}

// TestMessageBindings: the payload is the reader schema in the Avro
// format; the Kafka binding says the key is the aggregate id and where
// the schema id is; the headers are the CloudEvents and trace headers.
func TestMessageBindings(t *testing.T) {
	doc, _ := generate(t, load(t, map[string]string{"balances": accountEvent, "customers": customer}))
	msg := at(t, doc, "channels", "accounts", "messages", "AccountEvent")
	if got := at(t, msg, "payload", "schemaFormat"); got != "application/vnd.apache.avro;version=1.9.0" {
		t.Errorf("schemaFormat %v", got)
	}
	var reader any
	if err := json.Unmarshal([]byte(accountEvent), &reader); err != nil {
		t.Fatal(err)
	}
	if got := at(t, msg, "payload", "schema"); !reflect.DeepEqual(jsonRoundTrip(t, got), reader) {
		t.Errorf("payload schema %v, want the reader schema %v", got, reader)
	}
	kafka := at(t, msg, "bindings", "kafka").(map[string]any)
	for k, v := range map[string]any{"schemaIdLocation": "payload", "schemaIdPayloadEncoding": "confluent", "schemaLookupStrategy": "TopicNameStrategy", "bindingVersion": "0.5.0"} {
		if kafka[k] != v {
			t.Errorf("kafka message binding %s = %v, want %v", k, kafka[k], v)
		}
	}
	if got := at(t, kafka, "key", "type"); got != "string" {
		t.Errorf("key type %v, want string", got)
	}
	if d := at(t, kafka, "key", "description").(string); !strings.Contains(d, "account_id") {
		t.Errorf("key description %q names not the key field", d)
	}
	if _, ok := kafka["key"].(map[string]any)["pattern"]; ok {
		t.Errorf("a string key has a pattern")
	}
	// A number's key is its decimal digits.
	if got := at(t, doc, "channels", "customers", "messages", "Customer", "bindings", "kafka", "key", "pattern"); got != "^-?[0-9]+$" {
		t.Errorf("numeric key pattern %v", got)
	}
	if got := at(t, msg, "headers", "$ref"); got != "#/components/schemas/recordHeaders" {
		t.Errorf("headers %v", got)
	}
	headers := at(t, doc, "components", "schemas", "recordHeaders", "properties").(map[string]any)
	for _, h := range []string{"traceparent", "tracestate", "ce_id", "ce_type", "ce_source", "ce_specversion", "ce_time", "ce_subject", "content-type", "tenant"} {
		if headers[h] == nil {
			t.Errorf("header %s missing", h)
		}
	}
	if got := at(t, doc, "operations", "balances", "bindings", "kafka", "groupId", "enum"); !reflect.DeepEqual(got, []any{"accounts-projector"}) {
		t.Errorf("groupId %v, want the identity", got)
	}
	if got := at(t, doc, "operations", "balances", "action"); got != "receive" {
		t.Errorf("action %v", got)
	}
}

func jsonRoundTrip(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTombstones: every channel has a tombstone message, a null payload
// keyed by the aggregate id, and every operation receives it.
func TestTombstones(t *testing.T) {
	doc, _ := generate(t, load(t, map[string]string{"balances": accountEvent, "customers": customer}))
	for topic, op := range map[string]string{"accounts": "balances", "customers": "customers"} {
		ts := at(t, doc, "channels", topic, "messages", "tombstone")
		if got := at(t, ts, "payload", "type"); got != "null" {
			t.Errorf("%s tombstone payload type %v, want null", topic, got)
		}
		if got := at(t, ts, "bindings", "kafka", "key", "type"); got != "string" {
			t.Errorf("%s tombstone key %v", topic, got)
		}
		if r := refs(t, doc, op); r[len(r)-1] != "#/channels/"+topic+"/messages/tombstone" {
			t.Errorf("operation %s receives %v, not the tombstone", op, r)
		}
	}
}

// TestSnapshotAndFold: the operation says how the projection changes its
// row: a fold names the types that update and delete it, a snapshot its
// delete_on types and its gap policy.
func TestSnapshotAndFold(t *testing.T) {
	doc, _ := generate(t, load(t, map[string]string{"balances": accountEvent, "customers": customer}))
	fold := at(t, doc, "operations", "balances", "description").(string)
	for _, w := range []string{"(on_gap hold)", "Deposited, Withdrawn update it", "AccountClosed deletes it", "any other type only advances the version"} {
		if !strings.Contains(fold, w) {
			t.Errorf("fold description\n%s\nwant %q", fold, w)
		}
	}
	if got := at(t, doc, "operations", "balances", "summary"); got != "accounts into table balances (fold mode)." {
		t.Errorf("fold summary %v", got)
	}
	snap := at(t, doc, "operations", "customers", "description").(string)
	for _, w := range []string{"(on_gap apply)", "replaces the row", "Event types (field type) CustomerErased, CustomerMerged delete it."} {
		if !strings.Contains(snap, w) {
			t.Errorf("snapshot description\n%s\nwant %q", snap, w)
		}
	}
	if strings.Contains(snap, "update") {
		t.Errorf("snapshot description speaks of updates: %s", snap)
	}
}

// TestStableOutput: the same projections in another order write the same
// bytes, and the JSON form is the same document.
func TestStableOutput(t *testing.T) {
	srcs := load(t, map[string]string{"balances": accountEvent, "owners": accountEventSlim, "customers": customer})
	_, first := generate(t, srcs)
	reversed := []Source{srcs[2], srcs[1], srcs[0]}
	_, again := generate(t, reversed)
	if !bytes.Equal(first, again) {
		t.Errorf("the document depends on the projections' order")
	}
	var asJSON bytes.Buffer
	if err := Write(&asJSON, Config{Identity: "accounts-projector", Sources: srcs}, FormatJSON); err != nil {
		t.Fatal(err)
	}
	var fromJSON, fromYAML any
	if err := json.Unmarshal(asJSON.Bytes(), &fromJSON); err != nil {
		t.Fatalf("JSON form: %v", err)
	}
	if err := yaml.Unmarshal(first, &fromYAML); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromJSON, jsonRoundTrip(t, fromYAML)) {
		t.Errorf("the JSON and YAML forms differ")
	}
	if !strings.HasPrefix(string(first), "asyncapi: 3.0.0\ninfo:\n") {
		t.Errorf("the document begins\n%.40s", first)
	}
}

// TestRefusals: what cannot make a document is refused by what is wrong.
func TestRefusals(t *testing.T) {
	srcs := load(t, map[string]string{"balances": accountEvent})
	for _, c := range []struct {
		cfg    Config
		format string
		want   string
	}{
		{Config{Identity: "g", Sources: srcs}, "xml", `format "xml": want yaml or json`},
		{Config{Sources: srcs}, FormatYAML, "no consumer group identity"},
		{Config{Identity: "g"}, FormatYAML, "no projections"},
		{Config{Identity: "g", Sources: []Source{{Projection: srcs[0].Projection, Reader: `"string"`}}}, FormatYAML, `projection "balances": reader schema: a string, want a record`},
		{Config{Identity: "g", Sources: []Source{{Projection: srcs[0].Projection, Reader: `{"type": "record"`}}}, FormatYAML, `projection "balances": reader schema:`},
	} {
		var buf bytes.Buffer
		err := Write(&buf, c.cfg, c.format)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Write(%+v, %s): %v, want %q", c.cfg.Identity, c.format, err, c.want)
		}
		if buf.Len() > 0 {
			t.Errorf("a refused document wrote %d bytes", buf.Len())
		}
	}
}

// TestRecordNamedTombstone: a record of that name leaves the tombstone
// message its own.
func TestRecordNamedTombstone(t *testing.T) {
	reader := strings.Replace(accountEvent, `"name": "AccountEvent"`, `"name": "tombstone"`, 1)
	doc, _ := generate(t, load(t, map[string]string{"balances": reader}))
	msgs := at(t, doc, "channels", "accounts", "messages").(map[string]any)
	if len(msgs) != 2 || msgs["tombstone_balances"] == nil {
		t.Fatalf("messages %v, want tombstone_balances and tombstone", keysOf(msgs))
	}
	if got := at(t, msgs["tombstone"], "payload", "type"); got != "null" {
		t.Errorf("the tombstone's payload is %v", got)
	}
}
