package projection

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/internal/schemafile"
)

// File is the projection file: a list of declarative projections.
type File struct {
	Projections []Spec `yaml:"projections"`
}

// Spec is one projection as written in the YAML file.
type Spec struct {
	Name      string `yaml:"name"`
	Topic     string `yaml:"topic"`
	Table     string `yaml:"table"`
	Key       string `yaml:"key"`
	Version   string `yaml:"version"`
	Mode      string `yaml:"mode"`
	TypeField string `yaml:"type_field"`
	OnGap     string `yaml:"on_gap"`
	// Schema is a path to an .avsc file used as the reader schema,
	// relative to the projection file and inside its directory.
	Schema  string              `yaml:"schema"`
	Columns yaml.Node           `yaml:"columns"`
	Events  map[string]EventDef `yaml:"events"`
	// DeleteOn lists event types that delete the row (snapshot mode; fold
	// mode uses "delete: true" under events).
	DeleteOn []string `yaml:"delete_on"`
	// GapTimeout (on_gap repair): how long parked events wait before a
	// repair, e.g. 30s.
	GapTimeout string     `yaml:"gap_timeout"`
	Repair     *RepairDef `yaml:"repair"`
	// Fillfactor: the percentage of each page of the table that new rows
	// fill (see Projection.Fillfactor).
	Fillfactor int `yaml:"fillfactor"`
	// TombstoneRetention: how long a deleted aggregate's tombstone is
	// kept, e.g. 7d or 72h, or off to keep it forever (see
	// Projection.TombstoneRetention).
	TombstoneRetention string `yaml:"tombstone_retention"`
	// Filterable lists the columns the read API filters rows by (see
	// Projection.Filterable).
	Filterable []string `yaml:"filterable,omitempty"`
	// Tenant names the column holding each row's tenant (see
	// Projection.Tenant).
	Tenant string `yaml:"tenant,omitempty"`

	// withoutRepair lets on_gap repair compile without a repair source:
	// a stored definition leaves it to the deployment's file.
	withoutRepair bool
}

// RepairDef is the repair source in the YAML file: exactly one of HTTP
// and SQL.
type RepairDef struct {
	HTTP *struct {
		URL     string `yaml:"url"`
		Timeout string `yaml:"timeout"`
	} `yaml:"http"`
	SQL *struct {
		DatabaseURL string `yaml:"database_url"`
		Query       string `yaml:"query"`
	} `yaml:"sql"`
}

// ColumnSpec is one column in the YAML file.
type ColumnSpec struct {
	Type       string `yaml:"type"`
	PrimaryKey bool   `yaml:"primary_key"`
	Default    any    `yaml:"default"`
	Field      string `yaml:"field"`
}

// EventDef says what one event type does to the row in fold mode.
type EventDef struct {
	// Set: column ← Avro field name (a YAML string), or a literal:
	// {literal: value} (a number, boolean or string), or a bare YAML
	// number, boolean or null.
	Set map[string]any `yaml:"set"`
	// Add: column += Avro field (a YAML string), a leading "-" subtracts;
	// or += a constant, written {literal: 5}. A bare YAML number is
	// refused: Avro names start with a letter or _, so it could only name
	// a field that no event has.
	Add    map[string]any `yaml:"add"`
	Delete bool           `yaml:"delete"`
}

// Load reads and validates a projection file.
func Load(path string) ([]*Projection, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read projection file: %w", err)
	}
	ps, err := Parse(b, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ps, nil
}

// Parse parses a projection file's content; dir resolves relative schema
// paths.
//
// Its errors about the file's form give a line and column and what was
// wanted, and never quote the file beyond a clipped name: a --config
// pointed at the wrong file must not print it.
func Parse(content []byte, dir string) ([]*Projection, error) {
	// The document tree gives the decoder's errors their columns, and is
	// where over-long names are refused before any error can quote one.
	var root yaml.Node
	if err := yaml.Unmarshal(content, &root); err != nil {
		return nil, fmt.Errorf("parse: %w", yamlError(err, nil))
	}
	if err := checkNameLengths(&root, ""); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(content))
	dec.KnownFields(true)
	var f File
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("no projections defined")
		}
		return nil, fmt.Errorf("parse: %w", yamlError(err, &root))
	}
	if len(f.Projections) == 0 {
		return nil, errors.New("no projections defined")
	}
	out := make([]*Projection, 0, len(f.Projections))
	names := map[string]bool{}
	// tables: which projection writes each table, as written. Names that
	// differ in the file may still name one table (t and public.t):
	// postgres.Migrate resolves them as Postgres does and refuses those.
	tables := map[string]string{}
	for i, s := range f.Projections {
		p, err := s.compile(dir)
		if err != nil {
			if s.Name == "" {
				return nil, fmt.Errorf("projections[%d]: %w", i, err)
			}
			return nil, err
		}
		if names[p.Name] {
			return nil, fmt.Errorf("projection %q is defined twice", p.Name)
		}
		if other, ok := tables[p.Table]; ok {
			return nil, fmt.Errorf("projection %q: table %q is already written by projection %q: two projections would overwrite each other's rows", p.Name, p.Table, other)
		}
		names[p.Name], tables[p.Table] = true, p.Name
		out = append(out, p)
	}
	if err := CheckShared(out); err != nil {
		return nil, err
	}
	return out, nil
}

func (s Spec) compile(dir string) (*Projection, error) {
	p := &Projection{
		Name:         s.Name,
		Topic:        s.Topic,
		Table:        s.Table,
		KeyField:     s.Key,
		KeyColumn:    s.Key,
		VersionField: s.Version,
		TypeField:    s.TypeField,
		Mode:         Mode(s.Mode),
		OnGap:        GapPolicy(s.OnGap),
		DeleteTypes:  map[string]bool{},
		Fillfactor:   s.Fillfactor,
	}
	keep := s
	p.spec = &keep
	bad := func(format string, args ...any) error {
		return fmt.Errorf("projection %q: %s", s.Name, fmt.Sprintf(format, args...))
	}
	if s.Mode == "" {
		return nil, bad("mode is required: snapshot or fold")
	}
	if err := s.compileRepair(p); err != nil {
		return nil, bad("%v", err)
	}
	if s.TombstoneRetention != "" {
		d, err := ParseRetention(s.TombstoneRetention)
		if err != nil {
			return nil, bad("tombstone_retention %q: %v", s.TombstoneRetention, err)
		}
		p.TombstoneRetention = d
	}
	cols, defaults, err := parseColumns(&s.Columns)
	if err != nil {
		return nil, bad("columns: %v", err)
	}
	p.Columns, p.defaults = cols, defaults
	if s.Schema != "" {
		schema, err := readSchema(dir, s.Schema)
		if err != nil {
			return nil, bad("schema %q: %v", redact.Clip(s.Schema), err)
		}
		p.Schema, p.SchemaFile = schema, s.Schema
	}
	for _, t := range s.DeleteOn {
		p.DeleteTypes[t] = true
	}
	switch p.Mode {
	case ModeSnapshot:
		if len(s.DeleteOn) > 0 && p.TypeField == "" {
			return nil, bad("delete_on needs type_field: the field naming the event type")
		}
		if len(s.Events) > 0 {
			return nil, bad("events: only fold mode takes per-event verbs (use delete_on for snapshot deletes)")
		}
		p.kind = foldSnapshot
	case ModeFold:
		if len(s.DeleteOn) > 0 {
			return nil, bad("delete_on is for snapshot mode; in fold mode use delete: true under events")
		}
		if p.TypeField == "" {
			return nil, bad("type_field is required in fold mode")
		}
		if len(s.Events) == 0 {
			return nil, bad("events: fold mode needs at least one event type")
		}
		decl, err := compileFold(p, s.Events)
		if err != nil {
			return nil, bad("%v", err)
		}
		p.kind, p.decl = foldDecl, decl
	}
	p.Filterable, p.Tenant = s.Filterable, s.Tenant
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// parseColumns keeps the order the columns are written in. It also
// returns each default as the file gives it, to be converted again once
// Postgres has resolved the column's type (see Projection.SetTypes).
func parseColumns(n *yaml.Node) ([]Column, map[string]any, error) {
	if n.Kind == 0 {
		return nil, nil, errors.New("required")
	}
	if n.Kind != yaml.MappingNode {
		return nil, nil, fmt.Errorf("line %d: want a mapping of column name to {type: …}", n.Line)
	}
	var cols []Column
	defaults := map[string]any{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		name := n.Content[i].Value
		spec := n.Content[i+1]
		if spec.Kind != yaml.MappingNode {
			return nil, nil, fmt.Errorf("column %q: line %d: want {type: …}", name, spec.Line)
		}
		for k := 0; k+1 < len(spec.Content); k += 2 {
			switch key := spec.Content[k].Value; key {
			case "type", "primary_key", "default", "field":
			default:
				return nil, nil, fmt.Errorf("column %q: line %d: unknown field %q (want type, primary_key, default, field)", name, spec.Content[k].Line, key)
			}
		}
		var cs ColumnSpec
		if err := spec.Decode(&cs); err != nil {
			return nil, nil, fmt.Errorf("column %q: %w", name, err)
		}
		if cs.Type == "" {
			return nil, nil, fmt.Errorf("column %q: type is required", name)
		}
		c := Column{Name: name, Type: foldTypeName(cs.Type), PrimaryKey: cs.PrimaryKey, Field: cs.Field}
		if c.Field == "" {
			c.Field = name
		}
		if cs.Default != nil {
			v, err := c.Convert(cs.Default)
			if err != nil {
				return nil, nil, fmt.Errorf("column %q: default: %w", name, err)
			}
			c.Default, defaults[name] = v, cs.Default
		}
		cols = append(cols, c)
	}
	// The key column goes first.
	for i, c := range cols {
		if c.PrimaryKey {
			if i > 0 {
				copy(cols[1:i+1], cols[:i])
				cols[0] = c
			}
			break
		}
	}
	return cols, defaults, nil
}

// foldTypeName trims a type name and folds it to lower case outside
// double quotes, as Postgres folds unquoted identifiers.
func foldTypeName(s string) string {
	b := []byte(strings.TrimSpace(s))
	quoted := false
	for i, c := range b {
		switch {
		case c == '"':
			quoted = !quoted
		case !quoted && 'A' <= c && c <= 'Z':
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

func (s Spec) compileRepair(p *Projection) error {
	p.GapTimeout = DefaultGapTimeout
	if s.GapTimeout != "" {
		d, err := time.ParseDuration(s.GapTimeout)
		if err != nil || d <= 0 {
			return fmt.Errorf("gap_timeout %q: want a positive duration such as 30s", s.GapTimeout)
		}
		p.GapTimeout = d
	}
	if p.OnGap != GapRepair {
		if s.Repair != nil {
			return errors.New("repair: only used with on_gap: repair")
		}
		return nil
	}
	r := s.Repair
	if r == nil && s.withoutRepair {
		return nil // a stored definition checked on its own (see Definition.Compile)
	}
	if r == nil || (r.HTTP == nil) == (r.SQL == nil) {
		return errors.New("on_gap repair needs repair: with exactly one of http: {url} or sql: {database_url, query}")
	}
	p.Repair = &RepairSpec{}
	if r.HTTP != nil {
		if r.HTTP.URL == "" || !strings.Contains(r.HTTP.URL, "{key}") {
			return fmt.Errorf("repair.http.url %q: want a URL with a {key} placeholder", redact.Clip(redact.String(r.HTTP.URL)))
		}
		p.Repair.HTTPURL = r.HTTP.URL
		if r.HTTP.Timeout != "" {
			d, err := time.ParseDuration(r.HTTP.Timeout)
			if err != nil || d <= 0 {
				return fmt.Errorf("repair.http.timeout %q: want a positive duration", r.HTTP.Timeout)
			}
			p.Repair.HTTPTimeout = d
		}
		return nil
	}
	if r.SQL.DatabaseURL == "" || r.SQL.Query == "" {
		return errors.New("repair.sql: database_url and query are both required")
	}
	p.Repair.SQLDatabaseURL, p.Repair.SQLQuery = os.ExpandEnv(r.SQL.DatabaseURL), r.SQL.Query
	return nil
}

// readSchema reads the reader schema file path, which must lie inside dir
// (the projection file's directory): the file is read through an os.Root,
// so neither "..", an absolute path nor a symbolic link leads out of it.
// Its errors never quote the file: a path pointed at the wrong file must
// not print what that file holds.
func readSchema(dir, path string) (string, error) {
	if !filepath.IsLocal(path) {
		return "", errors.New("want a path relative to the projection file's directory, inside it")
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return "", fmt.Errorf("open the projection file's directory: %w", err)
	}
	defer root.Close()
	f, err := root.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, _, err := schemafile.Read(f)
	if err != nil {
		return "", err
	}
	if b = bytes.TrimSpace(b); b[0] != '{' {
		line, col := schemafile.Position(b, 1)
		return "", &schemafile.Error{Line: line, Column: col, Problem: "want a JSON object: an Avro record schema"}
	}
	return string(b), nil
}
