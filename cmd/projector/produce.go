package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/kafkaclient"
	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/schemas"
)

// The forms of a line --format takes.
const (
	formatJSON   = "json"
	formatRaw    = "raw"
	formatHex    = "hex"
	formatBase64 = "base64"
)

// maxLineErrors is how many failing lines an error spells out; the rest
// are counted.
const maxLineErrors = 10

type produceFlags struct {
	common
	topic      string
	schemaFile string
	subject    string
	keyField   string
	key        string
	file       string
	format     string
	tombstones stringList
	timeout    time.Duration
}

// stringList is a flag that may be given more than once.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error {
	*l = append(*l, s)
	return nil
}

func produceCommand(stdin io.Reader, stdout, stderr io.Writer) *ffcli.Command {
	f := &produceFlags{}
	return newCommand("produce", "projector produce --topic T [--schema FILE.avsc | --subject S] (--key-field F | --key K) [--file F] < events.jsonl",
		"Encode JSON lines (plain JSON or Avro's JSON encoding) into Confluent wire-format records and produce them; or tombstones, or raw bytes.", stderr,
		f.register,
		func(ctx context.Context, _ []string) error {
			// A stray argument is refused before this runs, as for every
			// command that takes none.
			return f.run(ctx, stdin, stdout, stderr)
		})
}

func (f *produceFlags) register(fs *flag.FlagSet) {
	f.common.register(fs, "brokers", "registry-url")
	// Without flags, produce talks to projector dev's embedded broker and
	// registry.
	setDefault(fs, "brokers", DevBrokers)
	setDefault(fs, "registry-url", DevRegistryURL)
	fs.StringVar(&f.topic, "topic", "", "topic to produce to")
	fs.StringVar(&f.schemaFile, "schema", "", "Avro schema file (.avsc) to register under --subject and encode with; without it, the latest schema of --subject")
	fs.StringVar(&f.subject, "subject", "", "registry subject of the value schema; default <topic>-value")
	fs.StringVar(&f.keyField, "key-field", "", "event field whose value (a string or a number) is the record key")
	fs.StringVar(&f.key, "key", "", "record key of every line, instead of --key-field")
	fs.StringVar(&f.file, "file", "", "file of events, one per line; default (or -): stdin")
	fs.StringVar(&f.format, "format", formatJSON, "what a line is: json (an event, encoded with the schema), or the record value's bytes as they are (raw), in hex (hex) or in base64 (base64), for poison pills")
	fs.Var(&f.tombstones, "tombstone", "send a tombstone (null value) with record key `KEY`; repeatable; without --file, stdin is not read (--file - reads it too)")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "how long registering and producing may take before produce gives up")
}

// setDefault changes the default of a registered flag, value and help
// alike.
func setDefault(fs *flag.FlagSet, name, value string) {
	fl := fs.Lookup(name)
	fl.DefValue = value
	_ = fl.Value.Set(value) // a string flag takes any value
}

// readsLines reports whether events come from the file or stdin: always,
// unless only tombstones are asked for.
func (f *produceFlags) readsLines() bool {
	return len(f.tombstones) == 0 || f.file != ""
}

func (f *produceFlags) validate() error {
	if f.topic == "" {
		return errors.New("--topic (PROJECTOR_PRODUCE_TOPIC) is required")
	}
	if err := projection.CheckTopic(f.topic); err != nil {
		return fmt.Errorf("--topic: %w", err)
	}
	if f.timeout <= 0 {
		return fmt.Errorf("--timeout %s: must be positive", f.timeout)
	}
	switch f.format {
	case formatJSON, formatRaw, formatHex, formatBase64:
	default:
		return fmt.Errorf("--format %q: want json, raw, hex or base64", f.format)
	}
	if f.keyField != "" && f.key != "" {
		return errors.New("--key-field and --key both given: take the key from a field of each event (--key-field) or give one key for every line (--key)")
	}
	if f.format != formatJSON {
		if f.keyField != "" {
			return fmt.Errorf("--key-field needs --format json: a %s line has no fields; give --key", f.format)
		}
		if f.schemaFile != "" || f.subject != "" {
			return fmt.Errorf("--schema and --subject need --format json: a %s line is the record value as it is", f.format)
		}
	}
	if f.readsLines() && f.keyField == "" && f.key == "" {
		return errors.New("no record key: give --key-field F (the key is the event's field F) or --key K (one key for every line)")
	}
	for _, k := range f.tombstones {
		if k == "" {
			return errors.New("--tombstone: the key is empty; a tombstone deletes the row of its key")
		}
	}
	return nil
}

// inputLine is one non-blank line of the input and its number (1-based).
type inputLine struct {
	n    int
	text []byte
}

// readLines reads every line, skipping blank ones; a line may be of any
// length.
func readLines(r io.Reader) ([]inputLine, error) {
	br := bufio.NewReader(r)
	var out []inputLine
	for n := 1; ; n++ {
		text, err := br.ReadBytes('\n')
		if len(text) > 0 {
			text = bytes.TrimSuffix(bytes.TrimSuffix(text, []byte("\n")), []byte("\r"))
			if len(bytes.TrimSpace(text)) > 0 {
				out = append(out, inputLine{n: n, text: text})
			}
		}
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
	}
}

// valueSchema is the schema lines are encoded with.
type valueSchema struct {
	id      int
	subject string
	schema  avro.Schema
}

// resolveSchema registers --schema under the subject, or looks up the
// subject's latest schema.
func (f *produceFlags) resolveSchema(ctx context.Context, cl *sr.Client) (valueSchema, error) {
	vs := valueSchema{subject: f.subject}
	if vs.subject == "" {
		vs.subject = f.topic + "-value"
	}
	if f.schemaFile != "" {
		text, schema, err := readSchemaFile(f.schemaFile)
		if err != nil {
			return vs, fmt.Errorf("--schema %w", err)
		}
		vs.schema = schema
		ids, err := schemas.Register(ctx, cl, vs.subject, string(text))
		if err != nil {
			return vs, fmt.Errorf("--schema %s: %w", f.schemaFile, err)
		}
		vs.id = ids[0]
		return vs, nil
	}
	ss, err := cl.SchemaByVersion(ctx, vs.subject, -1)
	if err != nil {
		var re *sr.ResponseError
		if errors.As(err, &re) && (re.ErrorCode == sr.ErrSubjectNotFound.Code || re.ErrorCode == sr.ErrVersionNotFound.Code) {
			return vs, fmt.Errorf("subject %q has no schema in the registry: register one with --schema FILE.avsc, or name another with --subject", vs.subject)
		}
		return vs, fmt.Errorf("latest schema of subject %q: %w", vs.subject, err)
	}
	if ss.Type != sr.TypeAvro {
		return vs, fmt.Errorf("subject %q: the latest schema is %s, not Avro", vs.subject, ss.Type)
	}
	if len(ss.References) > 0 {
		return vs, fmt.Errorf("subject %q: the latest schema (id %d) has references, which produce does not follow", vs.subject, ss.ID)
	}
	if vs.schema, err = avro.Parse(ss.Schema.Schema); err != nil {
		return vs, fmt.Errorf("subject %q: the latest schema (id %d) does not parse: %w", vs.subject, ss.ID, err)
	}
	vs.id = ss.ID
	return vs, nil
}

// checkKeyField refuses a --key-field the schema cannot give a key from,
// before any line is read into it.
func (f *produceFlags) checkKeyField(vs valueSchema) error {
	rec, ok := vs.schema.(*avro.RecordSchema)
	if !ok {
		return fmt.Errorf("--key-field %s: the schema of subject %q is a %s, not a record", f.keyField, vs.subject, vs.schema.Type())
	}
	var names []string
	for _, fl := range rec.Fields() {
		if fl.Name() == f.keyField {
			return nil
		}
		names = append(names, fl.Name())
	}
	return fmt.Errorf("--key-field %s: record %s has no such field (it has %s)", f.keyField, rec.FullName(), strings.Join(names, ", "))
}

// fieldKey is the record key a field's value gives: a string as it is, a
// number in decimal.
func fieldKey(field string, v any) (string, error) {
	if m, ok := v.(map[string]any); ok && len(m) == 1 { // a union's branch
		for _, x := range m {
			v = x
		}
	}
	switch x := v.(type) {
	case string:
		return x, nil
	case int:
		return strconv.Itoa(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case nil:
		return "", fmt.Errorf("--key-field %s: the event's %s is null", field, field)
	}
	return "", fmt.Errorf("--key-field %s: want a string, int or long, got a %T", field, v)
}

// encode turns every line into a record, or says which lines fail.
func (f *produceFlags) encode(lines []inputLine, vs valueSchema) ([]*kgo.Record, error) {
	records := make([]*kgo.Record, 0, len(lines)+len(f.tombstones))
	var problems []string
	failed := 0
	for _, l := range lines {
		r, err := f.encodeLine(l, vs)
		if err != nil {
			if failed++; failed <= maxLineErrors {
				// Clipped: an error quotes the line's field names, which
				// may be as long as the line.
				problems = append(problems, fmt.Sprintf("line %d: %s", l.n, redact.ClipTo(err.Error(), 2*redact.MaxQuoted)))
			}
			continue
		}
		records = append(records, r)
	}
	// A file's problems name it, as every error about a file does.
	file := ""
	if f.file != "" && f.file != "-" {
		file = f.file + ": "
	}
	switch {
	case failed == 1:
		return nil, fmt.Errorf("%s%s (nothing was produced)", file, problems[0])
	case failed > 0:
		more := ""
		if failed > maxLineErrors {
			more = fmt.Sprintf("\n  and %d more", failed-maxLineErrors)
		}
		return nil, fmt.Errorf("%s%d of %d lines do not encode; nothing was produced:\n  %s%s", file, failed, len(lines), strings.Join(problems, "\n  "), more)
	}
	for _, k := range f.tombstones {
		records = append(records, &kgo.Record{Topic: f.topic, Key: []byte(k)})
	}
	return records, nil
}

func (f *produceFlags) encodeLine(l inputLine, vs valueSchema) (*kgo.Record, error) {
	r := &kgo.Record{Topic: f.topic, Key: []byte(f.key), Context: context.WithValue(context.Background(), lineKey{}, l.n)}
	var err error
	switch f.format {
	case formatRaw:
		r.Value = l.text
	case formatHex:
		r.Value, err = hex.DecodeString(strings.Join(strings.Fields(string(l.text)), ""))
		if err != nil {
			return nil, fmt.Errorf("not hex: %w", err)
		}
	case formatBase64:
		r.Value, err = base64.StdEncoding.DecodeString(strings.TrimSpace(string(l.text)))
		if err != nil {
			return nil, fmt.Errorf("not base64: %w", err)
		}
	default:
		v, err := schemas.FromJSON(vs.schema, l.text)
		if err != nil {
			return nil, err
		}
		if f.keyField != "" {
			m, _ := v.(map[string]any) // checkKeyField made sure of a record
			fv, ok := m[f.keyField]
			if !ok {
				return nil, fmt.Errorf("--key-field %s: the event has no %s", f.keyField, f.keyField)
			}
			key, err := fieldKey(f.keyField, fv)
			if err != nil {
				return nil, err
			}
			r.Key = []byte(key)
		}
		if r.Value, err = schemas.AppendWire(nil, vs.id, vs.schema, v); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// lineKey marks a record's context with its input line, so that a failed
// delivery can name it.
type lineKey struct{}

func lineOf(r *kgo.Record) int {
	n, _ := r.Context.Value(lineKey{}).(int)
	return n
}

func (f *produceFlags) run(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) error {
	if err := f.validate(); err != nil {
		return err
	}
	// The client's warnings (an unreachable broker) reach the terminal
	// once a minute each, as text: this is a command a person runs.
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn, ReplaceAttr: redact.ReplaceAttr}))
	kcfg, err := f.kafkaConfig(log, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	// Everything is read and encoded before anything is produced, so that a
	// bad line leaves the topic as it was.
	var lines []inputLine
	if f.readsLines() {
		in := stdin
		if f.file != "" && f.file != "-" {
			file, err := os.Open(f.file)
			if err != nil {
				return fmt.Errorf("--file: %w", err)
			}
			defer file.Close()
			in = file
		}
		if lines, err = readLines(in); err != nil {
			return fmt.Errorf("reading %s: %w", f.inputName(), err)
		}
		if len(lines) == 0 && len(f.tombstones) == 0 {
			return fmt.Errorf("%s has no events: nothing to produce", f.inputName())
		}
	}
	var vs valueSchema
	if f.format == formatJSON && len(lines) > 0 {
		reg, err := f.registryClient()
		if err != nil {
			return err
		}
		if vs, err = f.resolveSchema(ctx, reg); err != nil {
			return err
		}
		if f.keyField != "" {
			if err := f.checkKeyField(vs); err != nil {
				return err
			}
		}
	}
	records, err := f.encode(lines, vs)
	if err != nil {
		return err
	}

	// franz-go's producer is idempotent with acks from all in-sync replicas
	// by default; both are stated so that no option can weaken them.
	cl, err := kafkaclient.New(kcfg,
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(f.timeout),
	)
	if err != nil {
		return fmt.Errorf("--brokers: %w", err)
	}
	defer cl.Close()
	// Refused credentials fail at once: the producer would retry them
	// until --timeout and may then report only the deadline. Any other
	// failure (a broker still starting) is left to the producer's
	// retries.
	if err := cl.Ping(ctx); errors.Is(err, kerr.SaslAuthenticationFailed) {
		return fmt.Errorf("Kafka at %s: %w", strings.Join(kcfg.Brokers, ","), err)
	}
	results := cl.ProduceSync(ctx, records...)
	if err := f.deliveryError(results, len(records)); err != nil {
		return err
	}
	fmt.Fprintln(stdout, f.summary(results, vs))
	return nil
}

func (f *produceFlags) inputName() string {
	if f.file == "" || f.file == "-" {
		return "stdin"
	}
	return f.file
}

// deliveryError says which records were not produced, grouped by what
// failed, naming their lines (or tombstone keys).
func (f *produceFlags) deliveryError(results kgo.ProduceResults, total int) error {
	type group struct {
		err   error
		where []string
	}
	var groups []*group
	failed := 0
	for _, res := range results {
		if res.Err == nil {
			continue
		}
		failed++
		where := "tombstone " + strconv.Quote(string(res.Record.Key))
		if n := lineOf(res.Record); n > 0 {
			where = "line " + strconv.Itoa(n)
		}
		i := slices.IndexFunc(groups, func(g *group) bool { return g.err.Error() == res.Err.Error() })
		if i < 0 {
			groups = append(groups, &group{err: res.Err})
			i = len(groups) - 1
		}
		groups[i].where = append(groups[i].where, where)
	}
	if failed == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d records were not produced to %s", failed, total, f.topic)
	for _, g := range groups {
		where := g.where
		more := ""
		if len(where) > maxLineErrors {
			more = fmt.Sprintf(" and %d more", len(where)-maxLineErrors)
			where = where[:maxLineErrors]
		}
		fmt.Fprintf(&b, "\n  %s%s: %v", strings.Join(where, ", "), more, g.err)
	}
	errs := make([]error, len(groups))
	for i, g := range groups {
		errs[i] = g.err
	}
	return &joinedError{msg: b.String(), errs: errs}
}

// joinedError is a message of its own over errs, which callers can still
// inspect with errors.Is and errors.As.
type joinedError struct {
	msg  string
	errs []error
}

func (e *joinedError) Error() string   { return e.msg }
func (e *joinedError) Unwrap() []error { return e.errs }

// summary is the one line a successful produce prints.
func (f *produceFlags) summary(results kgo.ProduceResults, vs valueSchema) string {
	var parts []int32
	tombstones := 0
	for _, res := range results {
		if !slices.Contains(parts, res.Record.Partition) {
			parts = append(parts, res.Record.Partition)
		}
		if res.Record.Value == nil {
			tombstones++
		}
	}
	slices.Sort(parts)
	ps := make([]string, len(parts))
	for i, p := range parts {
		ps[i] = strconv.Itoa(int(p))
	}
	what := plural(len(results), "record")
	if tombstones > 0 {
		what += " (" + plural(tombstones, "tombstone") + ")"
	}
	schema := "no schema"
	if vs.schema != nil {
		schema = fmt.Sprintf("schema id %d (subject %s)", vs.id, vs.subject)
	}
	return fmt.Sprintf("produced %s to %s, partitions %s, %s", what, f.topic, strings.Join(ps, ","), schema)
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
