package projection

import (
	"errors"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strings"
)

// foldKind is which fold a projection runs: the engine folds a
// declarative projection's events through code that knows its columns.
type foldKind uint8

const (
	foldGo       foldKind = iota // Projection.Fold
	foldSnapshot                 // a snapshot-mode file's: every column from the event
	foldDecl                     // a fold-mode file's verbs (Projection.decl)
)

// foldKind returns the fold p runs: a Go fold set in Fold takes the place
// of the one compiled from a file.
func (p *Projection) foldKind() foldKind {
	if p.Fold != nil {
		return foldGo
	}
	return p.kind
}

// Apply folds ev into state with p's fold: its Go fold when Fold is set,
// otherwise the one compiled from its file. state is not modified.
func (p *Projection) Apply(state Row, ev Event) (Row, error) {
	switch p.foldKind() {
	case foldSnapshot:
		return snapshotFolder{p}.apply(nil, ev)
	case foldDecl:
		return p.decl.apply(state, ev, false)
	}
	if p.Fold == nil {
		return nil, fmt.Errorf("projection %q: no fold", p.Name)
	}
	return p.Fold(state, ev)
}

// snapshotFolder builds the whole row from the event: every column takes
// the Avro field of its Field name.
type snapshotFolder struct{ p *Projection }

// FoldReadsRow reports whether p's fold may read the row it is given. A
// declarative snapshot projection's does not: it builds every row from the
// event alone, so that only whether a row exists matters, not what it
// holds. Any other fold, a Go fold included, may.
func (p *Projection) FoldReadsRow() bool { return p.foldKind() != foldSnapshot }

// ReadsFieldsMap reports whether p's fold reads events' Fields: a Go fold
// does. The folds projector compiles from a projection's file read them
// through Event.Field, so they also take events built by NewEvent.
func (p *Projection) ReadsFieldsMap() bool { return p.foldKind() == foldGo }

// apply builds ev's row in a new map or, when into holds every column (a
// row an earlier fold built, which the caller owns), in into itself; into
// changes only once every value of the event has converted. An empty row,
// which only says that a row exists, is never written to.
func (s snapshotFolder) apply(into Row, ev Event) (Row, error) {
	p := s.p
	if ev.Tombstone() || p.DeleteTypes[ev.Type] {
		return nil, nil
	}
	cols := p.Columns
	var buf [8]any
	vals := buf[:0]
	for _, c := range cols[1:] {
		f, _ := ev.Field(c.Field)
		v, err := c.Convert(f)
		if err != nil {
			return nil, Terminal(fmt.Errorf("field %s: %w", c.Field, err))
		}
		vals = append(vals, v)
	}
	row := into
	if len(row) != len(cols) {
		row = make(Row, len(cols))
		row[cols[0].Name] = ev.Key // a row holds its key from its first event on
	}
	for i, c := range cols[1:] {
		row[c.Name] = vals[i]
	}
	return row, nil
}

type setOp struct {
	col     Column
	field   string // "" when literal
	literal any
}

type addOp struct {
	col     Column
	field   string // "" when literal
	literal any    // the constant added, in the column's kind
	negate  bool
}

type eventOps struct {
	set    []setOp
	add    []addOp
	delete bool
}

// compileFold turns the per-event-type verbs into a fold. Event types the
// file does not name advance the version and change nothing.
func compileFold(p *Projection, defs map[string]EventDef) (*declFold, error) {
	ops := make(map[string]eventOps, len(defs))
	// In the file's names' order, so that a file with several mistakes
	// is always refused with the same one first.
	for _, typ := range slices.Sorted(maps.Keys(defs)) {
		d := defs[typ]
		var eo eventOps
		eo.delete = d.Delete
		if d.Delete && (len(d.Set) > 0 || len(d.Add) > 0) {
			return nil, fmt.Errorf("events.%s: delete cannot be combined with set or add", typ)
		}
		if d.Delete {
			p.DeleteTypes[typ] = true
		}
		for _, col := range slices.Sorted(maps.Keys(d.Set)) {
			src := d.Set[col]
			c, ok := p.Column(col)
			if !ok {
				return nil, fmt.Errorf("events.%s.set: no column %q", typ, col)
			}
			if c.PrimaryKey {
				return nil, fmt.Errorf("events.%s.set: the key column %q comes from the key field", typ, col)
			}
			op := setOp{col: c}
			switch v := src.(type) {
			case string:
				op.field = v
			case map[string]any:
				lit, ok := v["literal"]
				if !ok || len(v) != 1 {
					return nil, fmt.Errorf("events.%s.set.%s: want a field name or {literal: value}", typ, col)
				}
				conv, err := c.Convert(lit)
				if err != nil {
					return nil, fmt.Errorf("events.%s.set.%s: %w", typ, col, err)
				}
				op.literal = conv
			default:
				conv, err := c.Convert(v)
				if err != nil {
					return nil, fmt.Errorf("events.%s.set.%s: %w", typ, col, err)
				}
				op.literal = conv
			}
			eo.set = append(eo.set, op)
		}
		for _, col := range slices.Sorted(maps.Keys(d.Add)) {
			src := d.Add[col]
			c, ok := p.Column(col)
			if !ok {
				return nil, fmt.Errorf("events.%s.add: no column %q", typ, col)
			}
			if k := c.Kind(); k != KindInt && k != KindFloat && !isNumeric(c.Type) {
				return nil, fmt.Errorf("events.%s.add.%s: column type %s is not numeric: add needs an integer, floating-point or numeric column", typ, col, c.Type)
			}
			op, err := compileAdd(c, src)
			if err != nil {
				return nil, fmt.Errorf("events.%s.add.%s: %w", typ, col, err)
			}
			eo.add = append(eo.add, op)
		}
		ops[typ] = eo
	}
	blank := make(Row, len(p.Columns))
	for _, c := range p.Columns {
		blank[c.Name] = c.Default // the key's is overwritten
	}
	return &declFold{cols: p.Columns, ops: ops, blank: blank, defs: defs}, nil
}

// compileAdd compiles one add: src is a field name, with a leading "-"
// to subtract, or {literal: n} to add a constant.
func compileAdd(c Column, src any) (addOp, error) {
	switch v := src.(type) {
	case string:
		op := addOp{col: c, field: strings.TrimSpace(v)}
		if strings.HasPrefix(op.field, "-") {
			op.negate, op.field = true, strings.TrimSpace(op.field[1:])
		}
		if op.field == "" {
			return addOp{}, errors.New("field name is empty")
		}
		return op, nil
	case map[string]any:
		lit, ok := v["literal"]
		if !ok || len(v) != 1 {
			return addOp{}, errors.New("want a field name or {literal: number}")
		}
		switch lit.(type) {
		case int, int64, uint64, float64:
		default:
			return addOp{}, fmt.Errorf("literal %v: want a number", lit)
		}
		conv, err := c.Convert(lit)
		if err != nil {
			return addOp{}, err
		}
		return addOp{col: c, literal: conv}, nil
	case nil:
		return addOp{}, errors.New("want a field name or {literal: number}")
	default:
		// A YAML number or boolean: as a field name it could never match,
		// since Avro names start with a letter or _.
		return addOp{}, fmt.Errorf("%v is not a field name: to add a constant write {literal: %v}", v, v)
	}
}

// declFold is the fold a fold-mode projection declares.
type declFold struct {
	cols []Column
	defs map[string]EventDef // what it was compiled from (see SetTypes)
	ops  map[string]eventOps
	// blank is a new aggregate's row before its first event: every
	// column at its default. Cloning it copies the map's storage in one
	// piece, where setting each column hashes its name.
	blank Row
}

// FoldOwned folds like Fold for a caller that owns row and, once the fold
// succeeds, no longer needs it: a declarative projection then writes the
// new row into row instead of copying it first (a snapshot one only into
// a row that holds every column, not into an empty row that only says the
// row exists). Whatever the fold, row is unchanged when it fails.
func (p *Projection) FoldOwned(row Row, ev Event) (Row, error) {
	switch p.foldKind() {
	case foldDecl:
		return p.decl.apply(row, ev, true)
	case foldSnapshot:
		return snapshotFolder{p}.apply(row, ev)
	}
	return p.Apply(row, ev)
}

// ReadFields lists the event fields p reads: its key, version and type
// fields and those its columns or verbs take values from; nil when its
// fold is a Go function, which may read any.
func (p *Projection) ReadFields() []string {
	fields := []string{p.KeyField, p.VersionField}
	if p.TypeField != "" {
		fields = append(fields, p.TypeField)
	}
	switch p.foldKind() {
	case foldSnapshot:
		for _, c := range p.Columns[1:] {
			fields = append(fields, c.Field)
		}
	case foldDecl:
		for _, eo := range p.decl.ops {
			for _, op := range eo.set {
				if op.field != "" {
					fields = append(fields, op.field)
				}
			}
			for _, op := range eo.add {
				if op.field != "" {
					fields = append(fields, op.field)
				}
			}
		}
	default:
		return nil
	}
	slices.Sort(fields)
	return slices.Compact(fields)
}

// apply folds ev into a copy of state or, with owned, into state itself;
// state changes only once every value of the event has converted.
func (d *declFold) apply(state Row, ev Event, owned bool) (Row, error) {
	if ev.Tombstone() {
		return nil, nil
	}
	eo, known := d.ops[ev.Type]
	if !known {
		if owned {
			return state, nil // not this projection's concern: only the version moves
		}
		return maps.Clone(state), nil
	}
	if eo.delete {
		return nil, nil
	}
	var buf [8]any
	vals := buf[:0] // the sets' values, then the adds' deltas
	for _, op := range eo.set {
		v := op.literal
		if op.field != "" {
			f, ok := ev.Field(op.field)
			if !ok {
				return nil, Terminal(fmt.Errorf("%s: set %s: event has no field %q", ev.Type, op.col.Name, op.field))
			}
			conv, err := op.col.Convert(f)
			if err != nil {
				return nil, Terminal(fmt.Errorf("%s: set from field %s: %w", ev.Type, op.field, err))
			}
			v = conv
		}
		vals = append(vals, v)
	}
	for _, op := range eo.add {
		f := op.literal // converted already: converting it again keeps it
		if op.field != "" {
			var ok bool
			if f, ok = ev.Field(op.field); !ok || f == nil {
				return nil, Terminal(fmt.Errorf("%s: add to %s: event has no value in field %q", ev.Type, op.col.Name, op.field))
			}
		}
		delta, err := op.col.Convert(f)
		if err != nil {
			return nil, Terminal(fmt.Errorf("%s: add from field %s: %w", ev.Type, op.field, err))
		}
		if isNumeric(op.col.Type) {
			// Exact decimals: the sum is computed now, so that a value
			// that is no number fails the event before the row changes.
			var cur any
			if state != nil {
				cur = state[op.col.Name]
			} else {
				cur = d.blank[op.col.Name]
			}
			for i, s := range eo.set {
				if s.col.Name == op.col.Name {
					cur = vals[i]
				}
			}
			if delta, err = addDecimal(op.col.Type, cur, delta, op.negate); err != nil {
				return nil, Terminal(fmt.Errorf("%s: add to %s from field %s: %w", ev.Type, op.col.Name, op.field, err))
			}
		}
		vals = append(vals, delta)
	}
	var row Row
	switch {
	case state == nil:
		row = maps.Clone(d.blank)
		row[d.cols[0].Name] = ev.Key
	case owned:
		row = state // a row holds its key from its first event on
	default:
		row = maps.Clone(state) // copies the map's storage in one piece
	}
	for i, op := range eo.set {
		row[op.col.Name] = vals[i]
	}
	for i, op := range eo.add {
		if isNumeric(op.col.Type) {
			row[op.col.Name] = vals[len(eo.set)+i] // the sum already
			continue
		}
		row[op.col.Name] = addValues(row[op.col.Name], vals[len(eo.set)+i], op.negate)
	}
	return row, nil
}

// addValues adds two values of one numeric kind; a NULL counts as zero.
func addValues(cur, delta any, negate bool) any {
	switch d := delta.(type) {
	case int64:
		c, _ := cur.(int64)
		if negate {
			return c - d
		}
		return c + d
	case float64:
		c, _ := cur.(float64)
		if negate {
			return c - d
		}
		return c + d
	}
	return cur
}

// isNumeric reports whether a column of type typ holds exact decimals
// (numeric, numeric(p,s)), in text form in a Row.
func isNumeric(typ string) bool {
	typ = strings.TrimPrefix(typ, "pg_catalog.")
	return typ == "numeric" || typ == "decimal" || strings.HasPrefix(typ, "numeric(") || strings.HasPrefix(typ, "decimal(")
}

// addDecimal adds two exact decimals in text form for a column of type
// typ, rounded as the column rounds them; a NULL counts as zero.
func addDecimal(typ string, cur, delta any, negate bool) (string, error) {
	parse := func(what string, v any) (*big.Rat, error) {
		r := new(big.Rat)
		if v == nil {
			return r, nil
		}
		s, _ := v.(string)
		if _, ok := r.SetString(s); !ok {
			return nil, fmt.Errorf("%s %v is not a finite decimal", what, v)
		}
		return r, nil
	}
	c, err := parse("current value", cur)
	if err != nil {
		return "", err
	}
	d, err := parse("value", delta)
	if err != nil {
		return "", err
	}
	if negate {
		d.Neg(d)
	}
	return decimalText(typ, c.Add(c, d)), nil
}

// Constant is a value a projection writes into a column whatever the
// event: a default, or a literal its declarative fold sets.
type Constant struct {
	Column Column
	// Value is in the Go type of the column's kind (see Row); never nil.
	Value any
	// Where names it in the projection file: "default", or
	// "events.<type>.set".
	Where string
}

// Constants lists p's column defaults and the literals its declarative
// fold sets, so that they can be proved against the column types before
// any event needs them (see postgres.Migrate).
func (p *Projection) Constants() []Constant {
	var out []Constant
	for _, c := range p.Columns {
		if c.Default != nil {
			out = append(out, Constant{Column: c, Value: c.Default, Where: "default"})
		}
	}
	if p.foldKind() != foldDecl {
		return out
	}
	for _, typ := range slices.Sorted(maps.Keys(p.decl.ops)) {
		for _, op := range p.decl.ops[typ].set {
			if op.field == "" && op.literal != nil {
				out = append(out, Constant{Column: op.col, Value: op.literal, Where: "events." + typ + ".set"})
			}
		}
	}
	return out
}

// Compiled returns the fold compiled from p's file, whatever Fold holds:
// nil for a projection defined in Go. A Go fold may wrap it.
func (p *Projection) Compiled() FoldFunc {
	switch p.kind {
	case foldSnapshot:
		return func(_ Row, ev Event) (Row, error) { return snapshotFolder{p}.apply(nil, ev) }
	case foldDecl:
		return func(state Row, ev Event) (Row, error) { return p.decl.apply(state, ev, false) }
	}
	return nil
}

// Use is what a projection does with an event field it names.
type Use uint8

const (
	UseKey     Use = iota + 1 // the aggregate id
	UseVersion                // the aggregate version
	UseType                   // the event type
	UseColumn                 // a column's value: a snapshot column, or a set
	UseAdd                    // added to a numeric column
)

// FieldUse is one place a projection names an event field.
type FieldUse struct {
	// Where names the place in the projection file: "key", "version",
	// "type_field", "columns.<column>.field", "events.<type>.set.<column>"
	// or "events.<type>.add.<column>".
	Where string
	Field string
	Use   Use
	// Column is the column the field fills (UseColumn, UseAdd).
	Column Column
}

// FieldUses lists every event field p names and what it does with it, in
// the order of the file's keys: so that the fields can be proved against
// a reader schema before any event needs them. A Go fold's reads are
// unknown: only its key, version and type fields are listed.
func (p *Projection) FieldUses() []FieldUse {
	out := []FieldUse{
		{Where: "key", Field: p.KeyField, Use: UseKey},
		{Where: "version", Field: p.VersionField, Use: UseVersion},
	}
	if p.TypeField != "" {
		out = append(out, FieldUse{Where: "type_field", Field: p.TypeField, Use: UseType})
	}
	switch p.foldKind() {
	case foldSnapshot:
		for _, c := range p.Columns[1:] {
			out = append(out, FieldUse{Where: "columns." + c.Name + ".field", Field: c.Field, Use: UseColumn, Column: c})
		}
	case foldDecl:
		for _, typ := range slices.Sorted(maps.Keys(p.decl.ops)) {
			eo := p.decl.ops[typ]
			var uses []FieldUse
			for _, op := range eo.set {
				if op.field != "" {
					uses = append(uses, FieldUse{Where: "events." + typ + ".set." + op.col.Name, Field: op.field, Use: UseColumn, Column: op.col})
				}
			}
			for _, op := range eo.add {
				if op.field != "" {
					uses = append(uses, FieldUse{Where: "events." + typ + ".add." + op.col.Name, Field: op.field, Use: UseAdd, Column: op.col})
				}
			}
			slices.SortFunc(uses, func(a, b FieldUse) int { return strings.Compare(a.Where, b.Where) })
			out = append(out, uses...)
		}
	}
	return out
}
