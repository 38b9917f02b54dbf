package projection

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Event is one decoded event offered to a fold.
type Event struct {
	// Key is the aggregate id.
	Key string
	// Version is the aggregate version the event carries (1-based).
	Version int64
	// Type is the event type (fold mode), "" when the projection has none.
	Type string
	// Fields is the decoded Avro record. Nil for a tombstone, and for an
	// event the engine built with NewEvent (read those through Field).
	Fields map[string]any

	// names and values: the record as NewEvent was given it.
	names  []string
	values []any
}

// NewEvent returns an event whose record is values, each the value of
// the field of the same index in names, without the map Fields would take
// to build: the engine decodes events this way for the folds projector
// compiles from a projection's file, which read them through Field (see
// Projection.ReadsFieldsMap). names must not be nil.
func NewEvent(key string, version int64, typ string, names []string, values []any) Event {
	return Event{Key: key, Version: version, Type: typ, names: names, values: values}
}

// Field returns the value of the record's field name and whether the
// record has that field.
func (ev Event) Field(name string) (any, bool) {
	if ev.Fields != nil {
		v, ok := ev.Fields[name]
		return v, ok
	}
	for i, n := range ev.names {
		if n == name {
			return ev.values[i], true
		}
	}
	return nil, false
}

// Tombstone reports whether the event is a tombstone: it has no record.
func (ev Event) Tombstone() bool { return ev.Fields == nil && ev.names == nil }

// Row is the state of one aggregate as stored in the projection's table,
// column name → value. Values use the Go types of the column's kind:
// int64 (smallint, integer, bigint), float64 (real, double precision),
// bool (boolean), string (every other type, in Postgres text form: an
// array as an array literal, json and jsonb as JSON text, numeric as an
// exact decimal), or nil. Being strings, such values are compared and
// copied safely.
type Row map[string]any

// FoldFunc folds one event into the aggregate's state. state is nil when the
// aggregate has no row (never seen, or deleted). It must not be modified
// (the engine still needs it when the fold fails): return a new Row. Returning a
// nil Row deletes the row. A returned error fails this event: wrap it with Terminal when
// retrying cannot help, so the event is dead-lettered.
type FoldFunc func(state Row, ev Event) (Row, error)

// Mode is how events become rows.
type Mode string

const (
	// ModeSnapshot: each event carries the aggregate's full state; a newer
	// version replaces the row.
	ModeSnapshot Mode = "snapshot"
	// ModeFold: each event type updates columns through verbs (set, add,
	// delete), or a Go FoldFunc does.
	ModeFold Mode = "fold"
)

// GapPolicy is what happens when a version arrives beyond the next one.
type GapPolicy string

const (
	// GapHold parks the event until the missing versions arrive.
	GapHold GapPolicy = "hold"
	// GapApply accepts a newer snapshot over the gap (snapshot mode only).
	GapApply GapPolicy = "apply"
	// GapRepair parks like hold, and after GapTimeout asks a repair source
	// for the aggregate's state at or beyond the missing version.
	GapRepair GapPolicy = "repair"
)

// RepairSpec says where repairs come from: an HTTP endpoint or a SQL query.
type RepairSpec struct {
	// HTTPURL is a URL template with {key} and optionally {version}.
	HTTPURL     string
	HTTPTimeout time.Duration
	// SQLDatabaseURL and SQLQuery: the query runs with $1 = key and
	// $2 = the missing version.
	SQLDatabaseURL string
	SQLQuery       string
}

// Projection is one read model: a topic folded into a table.
type Projection struct {
	Name  string
	Topic string
	Table string
	// KeyField is the Avro field holding the aggregate id; its column is
	// KeyColumn (default: KeyField).
	KeyField  string
	KeyColumn string
	// VersionField is the Avro long field with the aggregate version
	// (default "version").
	VersionField string
	// TypeField names the event type field (fold mode), "" if unused.
	TypeField string
	// Mode defaults to ModeFold, OnGap to GapHold.
	Mode  Mode
	OnGap GapPolicy
	// Columns in table order, the key column first. The engine adds a
	// "version bigint" column after them.
	Columns []Column
	// Schema optionally holds the reader schema (Avro JSON). Empty: the
	// latest schema registered for "<topic>-value" is used.
	Schema string
	// SchemaFile is the schema: path of the projection file it came from,
	// as written there (relative to the file); empty otherwise.
	SchemaFile string
	// Fold is a Go fold computing the new row. Nil in a projection parsed
	// from a file, whose fold is compiled from its events or columns;
	// setting it there replaces that fold. Apply folds with whichever
	// the projection runs.
	Fold FoldFunc
	kind foldKind  // the fold compiled from a file, when Fold is nil
	decl *declFold // the compiled fold of a fold-mode file (see FoldOwned)
	// defaults: column name → its default as the file gives it (see
	// SetTypes).
	defaults map[string]any
	// DeleteTypes are event types that delete the row (besides tombstones).
	DeleteTypes map[string]bool
	// GapTimeout is how long events wait for a missing version before a
	// repair is attempted (on_gap repair; default DefaultGapTimeout).
	GapTimeout time.Duration
	// Repair configures the repair source of a declarative projection;
	// library users may hand the engine a Repairer instead.
	Repair *RepairSpec
	// Fillfactor is the percentage of each page of the table that new
	// rows fill (10 to 100). The rest is room for the versions updates
	// write: an update whose new version fits on its row's page writes
	// no index entry (a heap-only tuple). 0: a table the engine creates
	// gets DefaultFillfactor and an existing one keeps its own; otherwise
	// an existing table is given this one.
	Fillfactor int
	// TombstoneRetention is how long the engine keeps the tombstone of
	// a deleted aggregate, the last version it had, which stops a late
	// copy of one of its events from writing the row again; past it the
	// tombstone is pruned. Kafka's delete.retention.ms plays the same
	// part for a compacted topic's tombstones. 0: the engine's
	// (projector.Config.TombstoneRetention); negative: kept forever.
	TombstoneRetention time.Duration
	// Filterable are the columns the read API accepts equality filters
	// on; the engine creates an index on each. The key column needs none:
	// it is the primary key.
	Filterable []string
	// Tenant, when not empty, is the column holding each row's tenant: a
	// reader bound to a tenant sees only the rows whose column holds it.
	// The engine creates an index on it.
	Tenant string

	// spec is the projection as its file wrote it (nil for one built in
	// Go): what Definition stores.
	spec *Spec
}

// DefaultFillfactor is the fillfactor of the tables the engine creates.
// Postgres can reclaim the old version of an updated row only once no
// running transaction began before the update committed, and the engine
// keeps a transaction running almost all the time (the next one begins
// while the last commits), so a page must hold the new versions that
// several transactions write to its rows. With half of each page free
// nearly every update stays on its page, where with less most moved to
// another page, and the table ends no larger (the versions written
// elsewhere grow it as much). A table whose rows are rarely updated may
// take a higher one.
const DefaultFillfactor = 50

// TableFillfactor is the fillfactor the engine creates p's table with.
func (p *Projection) TableFillfactor() int {
	if p.Fillfactor == 0 {
		return DefaultFillfactor
	}
	return p.Fillfactor
}

// Column is one column of a projection's table.
type Column struct {
	Name string
	// Type is the Postgres type, e.g. "bigint": as written in the config
	// until postgres.Migrate gives it the name Postgres resolves it to
	// (see SetTypes), e.g. "timestamp(3) with time zone" for
	// "TIMESTAMPTZ(3)".
	Type       string
	PrimaryKey bool
	// Default is the value a new row starts with, nil for NULL.
	Default any
	// Field is the Avro field a snapshot takes the column from.
	Field string
}

// Kind is how a column's values are held in Go.
type Kind uint8

const (
	KindText Kind = iota
	KindInt
	KindFloat
	KindBool
)

// Kind returns how values of this column are held in Go.
func (c Column) Kind() Kind { return kindOf(c.Type) }

// Terminal marks err as one that retrying cannot fix: the event is
// dead-lettered instead of retried.
func Terminal(err error) error {
	if err == nil {
		return nil
	}
	return terminalError{err}
}

type terminalError struct{ error }

func (t terminalError) Unwrap() error { return t.error }

// IsTerminal reports whether err was marked with Terminal.
func IsTerminal(err error) bool {
	var t terminalError
	return errors.As(err, &t)
}

// Validate checks a projection defined in code or loaded from a file. Its
// errors name the projection and the field. Fields left at their zero
// value are given their defaults first: KeyColumn KeyField,
// VersionField "version", Mode
// ModeFold (a Go fold is one), OnGap GapHold and GapTimeout
// DefaultGapTimeout.
func (p *Projection) Validate() error {
	p.setDefaults()
	if p.Name == "" {
		return errors.New("projection: name is required")
	}
	if !identRe.MatchString(p.Name) {
		return fmt.Errorf("projection %q: name must match %s", p.Name, identRe)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("projection %q: %s", p.Name, fmt.Sprintf(format, args...))
	}
	if p.Topic == "" {
		return bad("topic is required")
	}
	if err := CheckTopic(p.Topic); err != nil {
		return fmt.Errorf("projection %q: %w", p.Name, err)
	}
	if p.Table == "" || !qualifiedRe.MatchString(p.Table) {
		return bad("table %q must be a plain or schema-qualified identifier", p.Table)
	}
	if p.KeyField == "" {
		return bad("key (the Avro field with the aggregate id) is required")
	}
	if p.VersionField == "" {
		return bad("version field is required")
	}
	switch p.Mode {
	case ModeSnapshot, ModeFold:
	default:
		return bad("mode %q: want snapshot or fold", p.Mode)
	}
	switch p.OnGap {
	case GapHold, GapRepair:
	case GapApply:
		if p.Mode != ModeSnapshot {
			return bad("on_gap apply needs mode snapshot: a fold cannot skip events")
		}
	default:
		return bad("on_gap %q: want hold, apply or repair", p.OnGap)
	}
	if p.Fillfactor != 0 && (p.Fillfactor < 10 || p.Fillfactor > 100) {
		return bad("fillfactor %d: want a percentage from 10 to 100", p.Fillfactor)
	}
	if len(p.Columns) == 0 {
		return bad("columns: at least the key column is required")
	}
	var keys []string
	for _, c := range p.Columns {
		if c.PrimaryKey {
			keys = append(keys, c.Name)
		}
	}
	if len(keys) != 1 {
		return bad("columns: exactly one column needs primary_key: true, found %d (%s)", len(keys), strings.Join(keys, ", "))
	}
	seen := map[string]bool{}
	for i, c := range p.Columns {
		if !identRe.MatchString(c.Name) {
			return bad("column %q: not a plain identifier", c.Name)
		}
		if c.Name == "version" {
			return bad("column %q: the engine adds the version column itself", c.Name)
		}
		if seen[c.Name] {
			return bad("column %q appears twice", c.Name)
		}
		seen[c.Name] = true
		if !typeNameOK(c.Type) {
			return bad("column %q: type %q is not a Postgres type name", c.Name, c.Type)
		}
		if c.PrimaryKey && i != 0 {
			return bad("column %q: the primary key column must come first", c.Name)
		}
	}
	if p.KeyColumn != p.Columns[0].Name {
		return bad("key column %q is not the primary key column %q", p.KeyColumn, p.Columns[0].Name)
	}
	if p.foldKind() == foldGo && p.Fold == nil {
		return bad("no fold: set events (fold mode) or a Go fold function")
	}
	return p.validateReads(seen, bad)
}

// validateReads checks what the read API is told of the projection: its
// filterable columns and its tenant column, each one of its columns.
func (p *Projection) validateReads(columns map[string]bool, bad func(string, ...any) error) error {
	filterable := map[string]bool{}
	for _, c := range p.Filterable {
		switch {
		case c == "version":
			return bad("filterable: %q: the version column is not filterable", c)
		case !columns[c]:
			return bad("filterable: %q is not a column of the projection (want one of %s)", c, strings.Join(p.columnNames(), ", "))
		case filterable[c]:
			return bad("filterable: %q appears twice", c)
		}
		filterable[c] = true
	}
	if p.Tenant != "" && !columns[p.Tenant] {
		return bad("tenant: %q is not a column of the projection (want one of %s)", p.Tenant, strings.Join(p.columnNames(), ", "))
	}
	return nil
}

// columnNames are the names of p's columns, in table order.
func (p *Projection) columnNames() []string {
	out := make([]string, len(p.Columns))
	for i, c := range p.Columns {
		out[i] = c.Name
	}
	return out
}

// DefaultGapTimeout is how long events wait for a missing version before
// a repair is attempted, unless the projection says otherwise.
const DefaultGapTimeout = 30 * time.Second

// setDefaults gives the fields a projection may leave unset their
// documented defaults, so that a projection defined in Go needs no more
// than a file does.
func (p *Projection) setDefaults() {
	if p.KeyColumn == "" {
		p.KeyColumn = p.KeyField
	}
	if p.VersionField == "" {
		p.VersionField = "version"
	}
	if p.Mode == "" {
		p.Mode = ModeFold
	}
	if p.OnGap == "" {
		p.OnGap = GapHold
	}
	if p.GapTimeout == 0 {
		p.GapTimeout = DefaultGapTimeout
	}
}

// Column returns the column named name.
func (p *Projection) Column(name string) (Column, bool) {
	for _, c := range p.Columns {
		if c.Name == name {
			return c, true
		}
	}
	return Column{}, false
}

// typeNameOK reports whether s may be a type name: not empty, and without
// what would end one in a statement (a semicolon, a quote or a comment).
// Whether it names a type, and no more than a type, only Postgres can
// say: postgres.Migrate asks it before it creates anything.
func typeNameOK(s string) bool {
	if s == "" || len(s) > 256 || strings.Contains(s, "--") || strings.Contains(s, "/*") {
		return false
	}
	for _, r := range s {
		if r < ' ' || r == 0x7f || r == ';' || r == '\'' || r == '\\' {
			return false
		}
	}
	return true
}

// SetTypes gives the columns the type names types, in column order: the
// names Postgres resolved them to, which the statements writing the table
// then use (postgres.Migrate calls it). The defaults and the literals of a
// declarative fold are converted again for the new types. It changes
// nothing when the names are those the columns have, so that migrating a
// projection again, even while it runs, is safe.
func (p *Projection) SetTypes(types []string) error {
	if len(types) != len(p.Columns) {
		return fmt.Errorf("projection %q: %d type names for %d columns", p.Name, len(types), len(p.Columns))
	}
	cols := slices.Clone(p.Columns)
	changed := false
	for i := range cols {
		c := &cols[i]
		if c.Type == types[i] {
			continue
		}
		changed, c.Type = true, types[i]
		raw, ok := p.defaults[c.Name]
		if !ok {
			raw = c.Default
		}
		v, err := c.Convert(raw)
		if err != nil {
			return fmt.Errorf("projection %q: column %q: default: %w", p.Name, c.Name, err)
		}
		c.Default = v
	}
	if !changed {
		return nil
	}
	if p.decl == nil {
		p.Columns = cols
		return nil
	}
	old := p.Columns
	p.Columns = cols
	decl, err := compileFold(p, p.decl.defs)
	if err != nil {
		p.Columns = old
		return fmt.Errorf("projection %q: %w", p.Name, err)
	}
	p.decl = decl
	return nil
}

// CheckShared refuses projections that cannot share their topic: one
// topic may feed several projections (each its own table, version gate
// and parked events, committed in one transaction with the partition's
// offset), but a partition has one repair loop, so a projection with
// on_gap repair must have its topic to itself. Each record's key is the
// aggregate id for every projection of its topic: a record whose key
// field names another aggregate is dead-lettered for that projection.
func CheckShared(ps []*Projection) error {
	byTopic := map[string][]*Projection{}
	for _, p := range ps {
		byTopic[p.Topic] = append(byTopic[p.Topic], p)
	}
	for _, p := range ps {
		shared := byTopic[p.Topic]
		if len(shared) < 2 || p.OnGap != GapRepair {
			continue
		}
		other := shared[0]
		if other == p {
			other = shared[1]
		}
		return fmt.Errorf("projection %q: on_gap repair needs topic %q to itself, and projection %q also reads it: use on_gap hold, or give the repaired projection its own consumer identity", p.Name, p.Topic, other.Name)
	}
	return nil
}
