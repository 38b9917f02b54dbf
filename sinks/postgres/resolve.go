package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projector-dev/projector/projection"
)

// ErrBadType reports a column whose type Postgres does not resolve to a
// type: a name it does not know, or more than a type name (a constraint,
// a default).
var ErrBadType = errors.New("not a Postgres type")

// ErrBadDefault reports a column default (or a literal a fold sets) that
// its column's type refuses.
var ErrBadDefault = errors.New("value does not fit the column type")

// ErrTableShared reports two projections that write one table.
var ErrTableShared = errors.New("two projections write one table")

// resolve proves the projections against Postgres before Migrate creates
// anything: every column type resolves to a type, which the column then
// takes the canonical name of (so every statement the sink builds uses
// the name Postgres would print), every default and fold literal casts to
// its column's type, and no two projections write one table.
func resolve(ctx context.Context, tx pgx.Tx, projections []*projection.Projection) error {
	if len(projections) == 0 {
		return nil
	}
	if err := resolveTypes(ctx, tx, projections); err != nil {
		return err
	}
	if err := checkConstants(ctx, tx, projections); err != nil {
		return err
	}
	return distinctTables(ctx, tx, projections)
}

// typeRef is one column's type as the projection gives it.
type typeRef struct {
	p   *projection.Projection
	col string
	typ string
}

// resolveTypes resolves every column's type with to_regtype, which parses
// the name alone (a constraint or a default after it is a syntax error)
// and returns NULL for a type that does not exist, and gives each column
// the name format_type prints for it, type modifiers included. to_regtype
// drops modifiers (the 3 of timestamp(3)), so they come from describing
// one statement selecting NULL cast to each type, which only a name
// to_regtype accepted is placed in.
func resolveTypes(ctx context.Context, tx pgx.Tx, projections []*projection.Projection) error {
	var refs []typeRef
	var names []string
	for _, p := range projections {
		for _, c := range p.Columns {
			refs = append(refs, typeRef{p, c.Name, c.Type})
			names = append(names, c.Type)
		}
	}
	oids, pseudo, err := regtypes(ctx, tx, names)
	var pg *pgconn.PgError
	if err != nil && !errors.As(err, &pg) {
		return fmt.Errorf("migrate: resolve column types: %w", err)
	}
	if err != nil {
		// Some name is not even a type name: find which, each on its own.
		for _, r := range refs {
			if _, _, err := regtypes(ctx, tx, []string{r.typ}); err != nil {
				return r.refuse(err, "want a type name alone: constraints and defaults are not part of it")
			}
		}
		return fmt.Errorf("migrate: resolve column types: %w", err)
	}
	for i, oid := range oids {
		switch {
		case oid == 0:
			return refs[i].refuse(nil, "no such type in this database (is the extension that defines it installed? does it need its schema, as in public.citext?)")
		case pseudo[i]:
			return refs[i].refuse(nil, "a pseudo-type, which no column can have")
		}
	}
	mods, err := typmods(ctx, tx, names, oids)
	if err != nil {
		return fmt.Errorf("migrate: resolve column type modifiers: %w", err)
	}
	var canonical []string
	if err := tx.QueryRow(ctx, `SELECT array_agg(format_type(o, m) ORDER BY i)
		FROM unnest($1::oid[], $2::integer[]) WITH ORDINALITY AS u(o, m, i)`, oids, mods).Scan(&canonical); err != nil {
		return fmt.Errorf("migrate: name column types: %w", err)
	}
	at := 0
	for _, p := range projections {
		if err := p.SetTypes(canonical[at : at+len(p.Columns)]); err != nil {
			return fmt.Errorf("%w: %w", ErrBadDefault, err)
		}
		at += len(p.Columns)
	}
	return nil
}

// regtypes returns the oid of each type name (0 when there is no such
// type) and whether it is a pseudo-type (void, record, anyelement...), in
// a savepoint: a name that is not a type name fails the query.
func regtypes(ctx context.Context, tx pgx.Tx, names []string) (oids []uint32, pseudo []bool, err error) {
	err = pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
		return sp.QueryRow(ctx, `SELECT array_agg(coalesce(t.oid, 0) ORDER BY u.i), array_agg(coalesce(t.typtype = 'p', false) ORDER BY u.i)
			FROM unnest($1::text[]) WITH ORDINALITY AS u(n, i)
			LEFT JOIN pg_type t ON t.oid = to_regtype(u.n)`, names).Scan(&oids, &pseudo)
	})
	return oids, pseudo, err
}

// typmods returns the type modifier of each type name (-1 for none), for
// names that to_regtype resolved to oids. Postgres describes a domain
// column as its base type; a domain has no modifier of its own.
func typmods(ctx context.Context, tx pgx.Tx, names []string, oids []uint32) ([]int32, error) {
	var sql strings.Builder
	sql.WriteString("SELECT ")
	for i, n := range names {
		if i > 0 {
			sql.WriteString(", ")
		}
		// The line break ends the name even if it ends in a comment.
		fmt.Fprintf(&sql, "NULL::%s\n", n)
	}
	desc, err := tx.Conn().PgConn().Prepare(ctx, "", sql.String(), nil)
	if err != nil {
		return nil, err
	}
	if len(desc.Fields) != len(names) {
		return nil, fmt.Errorf("described %d columns for %d type names", len(desc.Fields), len(names))
	}
	mods := make([]int32, len(names))
	for i, f := range desc.Fields {
		mods[i] = -1
		if f.DataTypeOID == oids[i] {
			mods[i] = f.TypeModifier
		}
	}
	return mods, nil
}

// refuse reports r's type as not a column type, for reason; cause is
// Postgres's error, if any.
func (r typeRef) refuse(cause error, reason string) error {
	var pg *pgconn.PgError
	if cause != nil && !errors.As(cause, &pg) {
		return fmt.Errorf("migrate: resolve the type of projection %q column %q: %w", r.p.Name, r.col, cause)
	}
	err := fmt.Errorf("projection %q: column %q: type %q: %w: %s", r.p.Name, r.col, r.typ, ErrBadType, reason)
	if cause != nil {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// checkConstants casts every column default and every literal a fold
// sets, in the text form the sink writes them in, to the column's type:
// one the type refuses would fail every event that needs it (a default,
// the first event of every new aggregate).
func checkConstants(ctx context.Context, tx pgx.Tx, projections []*projection.Projection) error {
	for _, p := range projections {
		for _, k := range p.Constants() {
			c := k.Column
			text, err := c.EncodeText(k.Value)
			if err != nil {
				return fmt.Errorf("projection %q: column %q: %s: %w: %w", p.Name, c.Name, k.Where, ErrBadDefault, err)
			}
			err = pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
				_, err := sp.Exec(ctx, fmt.Sprintf(`SELECT $1::text::%s`, c.Type), *text)
				return err
			})
			var pg *pgconn.PgError
			switch {
			case errors.As(err, &pg):
				return fmt.Errorf("projection %q: column %q: %s %q: %w %s: %w", p.Name, c.Name, k.Where, *text, ErrBadDefault, c.Type, err)
			case err != nil:
				return fmt.Errorf("migrate: check the %s of projection %q column %q: %w", k.Where, p.Name, c.Name, err)
			}
		}
	}
	return nil
}

// distinctTables refuses two projections whose tables are one, with names
// resolved as Postgres resolves them: an unqualified name is the table
// search_path finds or, when there is none, the one CREATE TABLE would
// make in current_schema().
func distinctTables(ctx context.Context, tx pgx.Tx, projections []*projection.Projection) error {
	tables := make([]string, len(projections))
	for i, p := range projections {
		tables[i] = p.Table
	}
	var resolved []*string
	// Table names are lower-case identifiers (see Projection.Validate):
	// none needs quoting.
	if err := tx.QueryRow(ctx, `SELECT array_agg(
			coalesce(n.nspname || '.' || c.relname,
			         CASE WHEN position('.' in u.t) > 0 THEN u.t ELSE current_schema() || '.' || u.t END)
			ORDER BY u.i)
		FROM unnest($1::text[]) WITH ORDINALITY AS u(t, i)
		LEFT JOIN pg_class c ON c.oid = to_regclass(u.t)
		LEFT JOIN pg_namespace n ON n.oid = c.relnamespace`, tables).Scan(&resolved); err != nil {
		return fmt.Errorf("migrate: resolve table names: %w", err)
	}
	owner := map[string]*projection.Projection{}
	for i, p := range projections {
		name := p.Table
		if resolved[i] != nil {
			name = *resolved[i]
		}
		if other, ok := owner[name]; ok {
			return fmt.Errorf("projections %q (table %s) and %q (table %s): %w: %s", other.Name, other.Table, p.Name, p.Table, ErrTableShared, name)
		}
		owner[name] = p
	}
	return nil
}
