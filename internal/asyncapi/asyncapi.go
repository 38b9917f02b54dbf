package asyncapi

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/hamba/avro/v2"
	"go.yaml.in/yaml/v3"

	"github.com/projector-dev/projector/projection"
)

// The versions the document is written against.
const (
	// Version is the AsyncAPI version of the document.
	Version = "3.0.0"
	// AvroFormat is the schema format of the Avro payloads, in the
	// AsyncAPI Avro schema parser's form.
	AvroFormat = "application/vnd.apache.avro;version=1.9.0"
	// KafkaBindingVersion is the version of the Kafka bindings.
	KafkaBindingVersion = "0.5.0"
)

// Formats Write writes.
const (
	FormatYAML = "yaml"
	FormatJSON = "json"
)

// Source is one projection and the reader schema it decodes its events
// into.
type Source struct {
	Projection *projection.Projection
	// Reader is the reader schema, Avro JSON.
	Reader string
	// ReaderFrom says where Reader comes from, in the document's words:
	// a file's name, or the registry subject it was the latest of.
	ReaderFrom string
}

// Config is what a document is written from.
type Config struct {
	// Identity is the consumer group the projections read in.
	Identity string
	// Version is the contract's version, the document's info.version.
	Version string
	// Sources are the projections, in any order: the document orders
	// channels by topic and operations by projection name.
	Sources []Source
}

// Write writes the document of cfg to w in format (FormatYAML or
// FormatJSON).
func Write(w io.Writer, cfg Config, format string) error {
	doc, err := document(cfg)
	if err != nil {
		return err
	}
	switch format {
	case FormatYAML:
		return writeYAML(w, doc)
	case FormatJSON:
		return writeJSON(w, doc)
	}
	return fmt.Errorf("format %q: want %s or %s", format, FormatYAML, FormatJSON)
}

// headersRef is where the messages' header schema is.
const headersRef = "#/components/schemas/recordHeaders"

// tombstoneID is the id of each channel's tombstone message.
const tombstoneID = "tombstone"

// message is one Avro message of a channel: a reader schema and the
// projections that read with it.
type message struct {
	id     string
	reader string
	schema *avro.RecordSchema
	from   string
	srcs   []Source
}

func document(cfg Config) (obj, error) {
	if len(cfg.Sources) == 0 {
		return nil, errors.New("no projections")
	}
	if cfg.Identity == "" {
		return nil, errors.New("no consumer group identity")
	}
	version := cmp.Or(cfg.Version, "1.0.0")
	srcs := slices.Clone(cfg.Sources)
	slices.SortStableFunc(srcs, func(a, b Source) int { return strings.Compare(a.Projection.Name, b.Projection.Name) })
	byTopic := map[string][]*message{}
	var topics []string
	opMessages := map[string]string{} // projection → its message's id
	for _, s := range srcs {
		p := s.Projection
		schema, err := recordSchema(s.Reader)
		if err != nil {
			return nil, fmt.Errorf("projection %q: reader schema: %w", p.Name, err)
		}
		msgs, seen := byTopic[p.Topic]
		if !seen {
			topics = append(topics, p.Topic)
		}
		i := slices.IndexFunc(msgs, func(m *message) bool { return m.schema.String() == schema.String() })
		if i < 0 {
			msgs = append(msgs, &message{reader: s.Reader, schema: schema, from: s.ReaderFrom})
			i = len(msgs) - 1
		}
		msgs[i].srcs = append(msgs[i].srcs, s)
		byTopic[p.Topic] = msgs
	}
	slices.Sort(topics)
	for _, t := range topics {
		msgs := byTopic[t]
		for _, m := range msgs {
			m.id = m.schema.Name()
			if m.id == tombstoneID || slices.ContainsFunc(msgs, func(o *message) bool { return o != m && o.schema.Name() == m.schema.Name() }) {
				// Two reader schemas of one record, or a record that
				// takes the tombstone's name: each is named after the
				// first projection that reads with it.
				m.id += "_" + m.srcs[0].Projection.Name
			}
			for _, s := range m.srcs {
				opMessages[s.Projection.Name] = m.id
			}
		}
	}

	channels := obj{}
	for _, t := range topics {
		ch, err := channel(t, byTopic[t])
		if err != nil {
			return nil, err
		}
		channels = channels.with(t, ch)
	}
	operations := obj{}
	for _, s := range srcs {
		operations = operations.with(s.Projection.Name, operation(s, opMessages[s.Projection.Name], cfg.Identity))
	}
	return obj{}.
		with("asyncapi", Version).
		with("info", obj{}.
			with("title", "Topics consumed by projector (consumer group "+cfg.Identity+")").
			with("version", version).
			with("description", infoDescription(cfg.Identity))).
		with("defaultContentType", "application/avro").
		with("channels", channels).
		with("operations", operations).
		with("components", obj{}.
			with("schemas", obj{}.
				with("recordHeaders", recordHeaders()))), nil
}

func infoDescription(identity string) string {
	return "The topics the consumer group " + identity + " reads, and what it needs of each record: " +
		"its key is the aggregate id; its value is Avro in the Confluent wire format, " +
		"the id of the writer schema in the payload's first bytes, and must resolve into the reader schema shown; " +
		"it carries the aggregate's version, 1-based and +1 per event of an aggregate; a null value (a tombstone) deletes the row of its key. " +
		"The headers are optional: projector links its spans to the trace context of traceparent and keeps every header of a record it dead-letters."
}

// recordSchema parses text, which must be an Avro record schema.
func recordSchema(text string) (*avro.RecordSchema, error) {
	s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		return nil, err
	}
	r, ok := s.(*avro.RecordSchema)
	if !ok {
		return nil, fmt.Errorf("a %s, want a record", s.Type())
	}
	return r, nil
}

func channel(topic string, msgs []*message) (obj, error) {
	var names []string
	var keyed []*message
	messages := obj{}
	for _, m := range msgs {
		for _, s := range m.srcs {
			names = append(names, s.Projection.Name)
		}
		keyed = append(keyed, m)
		payload, err := parseJSON(m.reader)
		if err != nil {
			return nil, fmt.Errorf("projection %q: reader schema: %w", m.srcs[0].Projection.Name, err)
		}
		messages = messages.with(m.id, obj{}.
			with("name", m.id).
			with("title", m.schema.FullName()).
			with("summary", fmt.Sprintf("An event of %s, as %s %s %s it.", topic, plural("projection", len(m.srcs)), projectionNames(m.srcs), verb(len(m.srcs), "reads", "read"))).
			with("description", messageDescription(topic, m)).
			with("contentType", "application/avro").
			with("headers", obj{}.with("$ref", headersRef)).
			with("payload", obj{}.
				with("schemaFormat", AvroFormat).
				with("schema", payload)).
			with("bindings", obj{}.with("kafka", obj{}.
				with("key", keySchema("The aggregate id: the text of the value's %s. "+
					"A record keyed otherwise, or without a key, is dead-lettered (class key_mismatch).", m)).
				with("schemaIdLocation", "payload").
				with("schemaIdPayloadEncoding", "confluent").
				with("schemaLookupStrategy", "TopicNameStrategy").
				with("bindingVersion", KafkaBindingVersion))))
	}
	messages = messages.with(tombstoneID, obj{}.
		with("name", tombstoneID).
		with("title", "Tombstone").
		with("summary", "A record with a null value: deletes the row of the aggregate its key names.").
		with("description", "The row is deleted and the aggregate's last version kept aside for the projection's tombstone_retention, "+
			"so that a late copy of an earlier event cannot write the row again; the aggregate's next version starts a new row. "+
			"A tombstone without a key is dead-lettered (class invalid).").
		with("payload", obj{}.with("type", "null")).
		with("bindings", obj{}.with("kafka", obj{}.
			with("key", keySchema("The id of the aggregate whose row is deleted: the text of the value's %s in its events.", keyed...)).
			with("bindingVersion", KafkaBindingVersion))))
	return obj{}.
		with("address", topic).
		with("title", topic).
		with("description", fmt.Sprintf("Read by %s %s. The records of one aggregate share its key, and so a partition, which keeps them in order; "+
			"partitions must not be added to the topic while it is in use.", plural("projection", len(names)), strings.Join(names, ", "))).
		with("messages", messages).
		with("bindings", obj{}.with("kafka", obj{}.
			with("topic", topic).
			with("bindingVersion", KafkaBindingVersion))), nil
}

func messageDescription(topic string, m *message) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Avro in the Confluent wire format: a zero byte, the writer schema's id in the registry (4 bytes, big-endian), then the Avro binary body. "+
		"The payload shown is the reader schema (%s): an event written with a schema registered under %s-value that resolves into it is read, so producers may add fields with defaults without a redeploy.",
		m.from, topic)
	for _, s := range m.srcs {
		fmt.Fprintf(&b, " Projection %s reads %s.", s.Projection.Name, fieldList(s.Projection))
	}
	return b.String()
}

// fieldList names the fields p reads and what for.
func fieldList(p *projection.Projection) string {
	parts := []string{p.KeyField + " (the aggregate id)", p.VersionField + " (the version, a long)"}
	if p.TypeField != "" {
		parts = append(parts, p.TypeField+" (the event type)")
	}
	var rest []string
	for _, f := range p.ReadFields() {
		if f != p.KeyField && f != p.VersionField && f != p.TypeField && !slices.Contains(rest, f) {
			rest = append(rest, f)
		}
	}
	if len(rest) > 0 {
		parts = append(parts, strings.Join(rest, ", "))
	}
	return strings.Join(parts, ", ")
}

// keySchema is the schema of the record key of the messages ms: the
// aggregate id's text (a string's or bytes' own, a number's decimal
// digits). desc says so, with %s for the key fields.
func keySchema(desc string, ms ...*message) obj {
	var fields []string
	numeric := true
	for _, m := range ms {
		for _, s := range m.srcs {
			f := s.Projection.KeyField
			if !slices.Contains(fields, f) {
				fields = append(fields, f)
			}
			numeric = numeric && isNumber(m.schema, f)
		}
	}
	text := fmt.Sprintf(desc, strings.Join(fields, " and "))
	if !numeric {
		return obj{}.with("type", "string").with("description", text)
	}
	return obj{}.
		with("type", "string").
		with("description", text+" A number's text is its decimal digits.").
		with("pattern", "^-?[0-9]+$")
}

// isNumber reports whether r's field is an int or a long.
func isNumber(r *avro.RecordSchema, field string) bool {
	for _, f := range r.Fields() {
		if f.Name() == field {
			t := f.Type().Type()
			return t == avro.Int || t == avro.Long
		}
	}
	return false
}

func operation(s Source, messageID, identity string) obj {
	p := s.Projection
	ref := "#/channels/" + pointerEscape(p.Topic)
	return obj{}.
		with("action", "receive").
		with("channel", obj{}.with("$ref", ref)).
		with("title", p.Name).
		with("summary", fmt.Sprintf("%s into table %s (%s mode).", p.Topic, p.Table, p.Mode)).
		with("description", operationDescription(p)).
		with("messages", []any{
			obj{}.with("$ref", ref+"/messages/"+pointerEscape(messageID)),
			obj{}.with("$ref", ref+"/messages/"+tombstoneID),
		}).
		with("bindings", obj{}.with("kafka", obj{}.
			with("groupId", obj{}.with("type", "string").with("enum", []any{identity})).
			with("bindingVersion", KafkaBindingVersion)))
}

func operationDescription(p *projection.Projection) string {
	var b strings.Builder
	fmt.Fprintf(&b, "One row per aggregate, keyed by %s, at the version of field %s. ", p.KeyField, p.VersionField)
	switch p.OnGap {
	case projection.GapApply:
		b.WriteString("A version beyond the next is applied over the gap (on_gap apply); an older or repeated one changes nothing. ")
	case projection.GapRepair:
		b.WriteString("A version beyond the next waits for the missing ones, which are asked of the repair source after gap_timeout (on_gap repair); an older or repeated one changes nothing. ")
	default:
		b.WriteString("A version beyond the next waits for the missing ones (on_gap hold); an older or repeated one changes nothing. ")
	}
	switch p.Mode {
	case projection.ModeSnapshot:
		b.WriteString("Each event carries the aggregate's whole state and replaces the row.")
		if dels := slices.Sorted(maps.Keys(p.DeleteTypes)); len(dels) > 0 {
			fmt.Fprintf(&b, " Event types (field %s) %s delete it.", p.TypeField, strings.Join(dels, ", "))
		}
	default:
		updates, deletes := eventTypes(p)
		fmt.Fprintf(&b, "Each event changes the row by its type (field %s):", p.TypeField)
		if len(updates) > 0 {
			fmt.Fprintf(&b, " %s %s it;", strings.Join(updates, ", "), verb(len(updates), "updates", "update"))
		}
		if len(deletes) > 0 {
			fmt.Fprintf(&b, " %s %s it;", strings.Join(deletes, ", "), verb(len(deletes), "deletes", "delete"))
		}
		b.WriteString(" any other type only advances the version.")
	}
	return b.String()
}

// eventTypes lists the event types p's fold updates the row on and those
// it deletes the row on, each sorted.
func eventTypes(p *projection.Projection) (updates, deletes []string) {
	def, err := p.Definition()
	if err != nil {
		return nil, nil
	}
	var f projection.File
	if err := yaml.Unmarshal(def.YAML, &f); err != nil || len(f.Projections) != 1 {
		return nil, nil
	}
	for _, typ := range slices.Sorted(maps.Keys(f.Projections[0].Events)) {
		if f.Projections[0].Events[typ].Delete {
			deletes = append(deletes, typ)
		} else {
			updates = append(updates, typ)
		}
	}
	return updates, deletes
}

func recordHeaders() obj {
	str := func(desc string) obj { return obj{}.with("type", "string").with("description", desc) }
	return obj{}.
		with("type", "object").
		with("description", "Kafka record headers, all optional: projector applies an event from its key and value alone. "+
			"The relay writes the CloudEvents attributes in the Kafka protocol binding's binary mode, and the W3C trace context of the event.").
		with("properties", obj{}.
			with("traceparent", str("W3C trace context: the span of the batch that applies the record links to it, and a dead letter keeps its trace id.").
				with("pattern", "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")).
			with("tracestate", str("W3C trace state, with traceparent.")).
			with("ce_specversion", str("CloudEvents spec version.").with("enum", []any{"1.0"})).
			with("ce_id", str("CloudEvents id: the event's stable id, the same on every copy of the event.")).
			with("ce_source", str("CloudEvents source.")).
			with("ce_type", str("CloudEvents type: the event type.")).
			with("ce_time", str("CloudEvents time, RFC 3339.").with("format", "date-time")).
			with("ce_subject", str("CloudEvents subject: by default the aggregate id.")).
			with("content-type", str("The value's content type.").with("enum", []any{"application/avro"})).
			with("tenant", str("The event's tenant, when it has one.")))
}

// pointerEscape escapes s as a JSON pointer's token.
func pointerEscape(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

func plural(word string, n int) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

func verb(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func projectionNames(srcs []Source) string {
	names := make([]string, len(srcs))
	for i, s := range srcs {
		names[i] = s.Projection.Name
	}
	return strings.Join(names, ", ")
}
