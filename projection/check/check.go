package check

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks/postgres"
)

// Registry is what Run needs of a Schema Registry (a *sr.Client).
type Registry interface {
	SubjectVersions(ctx context.Context, subject string) ([]int, error)
	SchemaByVersion(ctx context.Context, subject string, version int) (sr.SubjectSchema, error)
}

var _ Registry = (*sr.Client)(nil)

// Which writer versions of a subject Run proves a reader schema against.
const (
	// WritersAll: every version registered under the subject, since
	// the topic may still hold events written with any of them.
	WritersAll = "all"
	// WritersLatest: only the latest version, for topics whose retention
	// no longer holds events of older ones.
	WritersLatest = "latest"
)

// Config is what Run proves and against what.
type Config struct {
	Projections []*projection.Projection
	// Registry holds the writer schemas (and the reader schema of a
	// projection without a schema: file). Nil: only the reader schemas
	// of schema: files can be read, and no registered writer is proved.
	Registry Registry
	// Writers is WritersAll (the default) or WritersLatest.
	Writers string
	// Writer, when set, is a writer schema (Avro JSON) proved in place of
	// the registered ones: "can these projections read events written
	// with it?". WriterName names it in messages (a file name).
	Writer     string
	WriterName string
	// Readers are reader schemas already fetched, by projection name;
	// those missing are read from the schema: file or the registry.
	Readers map[string]avro.Schema
	// DB is the database whose tables the projections write. Nil: the
	// Postgres checks are skipped, with a note.
	DB *pgxpool.Pool
	// RequireDB: a database that cannot be asked fails Run instead of
	// being noted and skipped.
	RequireDB bool
}

// Problem is one thing that would make a projection fail.
type Problem struct {
	Projection string
	// Where names the place in the projection file: "key",
	// "events.Deposited.add.balance", "schema", "table"...
	Where string
	// Message says what is wrong and how to fix it.
	Message string
}

func (p Problem) String() string {
	if p.Where == "" {
		return fmt.Sprintf("projection %s: %s", p.Projection, p.Message)
	}
	return fmt.Sprintf("projection %s: %s: %s", p.Projection, p.Where, p.Message)
}

// Report is what Run found.
type Report struct {
	Problems []Problem
	// Notes say what was not proved, and why.
	Notes []string
	// Readers holds each reader schema that could be read, by projection
	// name.
	Readers map[string]avro.Schema
}

// ErrProblems is what Report.Err wraps.
var ErrProblems = errors.New("the projection file has problems")

// Err returns nil when the report holds no problem, or else an error
// listing every problem, one a line.
func (r *Report) Err() error {
	if len(r.Problems) == 0 {
		return nil
	}
	lines := make([]string, len(r.Problems))
	for i, p := range r.Problems {
		lines[i] = p.String()
	}
	return fmt.Errorf("%w (%d):\n%s", ErrProblems, len(lines), strings.Join(lines, "\n"))
}

func (r *Report) problem(p *projection.Projection, where, format string, args ...any) {
	r.Problems = append(r.Problems, Problem{Projection: p.Name, Where: where, Message: fmt.Sprintf(format, args...)})
}

// Run proves cfg.Projections. Problems found are in the report; the
// error reports failing to ask the registry or (with RequireDB) Postgres.
// It runs the Postgres checks first: they give each column the type name
// Postgres resolves, which the fields' types are then compared with.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	r := &Report{Readers: map[string]avro.Schema{}}
	switch cfg.Writers {
	case "", WritersAll, WritersLatest:
	default:
		return nil, fmt.Errorf("writers %q: want %s or %s", cfg.Writers, WritersAll, WritersLatest)
	}
	if err := checkDatabase(ctx, cfg, r); err != nil {
		return nil, err
	}
	var writer *sr.Schema
	if cfg.Writer != "" {
		writer = &sr.Schema{Schema: cfg.Writer, Type: sr.TypeAvro}
	}
	for _, p := range cfg.Projections {
		reader, err := readerSchema(ctx, cfg, p, r)
		if err != nil {
			return nil, err
		}
		if reader == nil {
			continue
		}
		r.Readers[p.Name] = reader
		if writer != nil {
			if err := schemas.Resolves(reader, *writer); err != nil {
				r.problem(p, "schema", "events written with %s cannot be read: %v; fix: make the new schema compatible (add fields with defaults, keep the record's name or add the old one to its aliases)", cfg.WriterName, err)
			}
		} else if err := checkWriters(ctx, cfg, p, reader, r); err != nil {
			return nil, err
		}
		checkFields(p, reader, r)
	}
	return r, nil
}

// subject is the registry subject of p's values.
func subject(p *projection.Projection) string { return p.Topic + "-value" }

// readerSchema returns p's reader schema, or nil with a problem when it
// has none.
func readerSchema(ctx context.Context, cfg Config, p *projection.Projection, r *Report) (avro.Schema, error) {
	if s, ok := cfg.Readers[p.Name]; ok {
		return s, nil
	}
	if p.Schema != "" {
		s, err := avro.ParseWithCache(p.Schema, "", &avro.SchemaCache{})
		if err != nil {
			r.problem(p, "schema", "not a valid Avro schema: %v", err)
			return nil, nil
		}
		return s, nil
	}
	if cfg.Registry == nil {
		r.problem(p, "schema", "no schema: file, and no registry to read the latest schema of subject %s from; fix: give --registry-url, or set schema: in the projection file", subject(p))
		return nil, nil
	}
	ss, err := cfg.Registry.SchemaByVersion(ctx, subject(p), -1)
	if notFound(err) {
		r.problem(p, "schema", "no schema registered under subject %s; fix: register the topic's value schema, or set schema: in the projection file", subject(p))
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("projection %s: latest schema of subject %s: %w", p.Name, subject(p), err)
	}
	s, err := avro.ParseWithCache(ss.Schema.Schema, "", &avro.SchemaCache{})
	if err != nil {
		r.problem(p, "schema", "the latest schema of subject %s (version %d) does not parse: %v", subject(p), ss.Version, err)
		return nil, nil
	}
	return s, nil
}

// notFound reports whether err is the registry's "no such subject" (or
// version).
func notFound(err error) bool {
	var re *sr.ResponseError
	return errors.As(err, &re) && sr.IsNotFoundError(re.ErrorCode)
}

// checkWriters proves reader against the writer versions of p's subject.
func checkWriters(ctx context.Context, cfg Config, p *projection.Projection, reader avro.Schema, r *Report) error {
	if cfg.Registry == nil {
		r.Notes = append(r.Notes, fmt.Sprintf("projection %s: no registry: the reader schema was not proved against registered writers", p.Name))
		return nil
	}
	versions, err := cfg.Registry.SubjectVersions(ctx, subject(p))
	if notFound(err) || err == nil && len(versions) == 0 {
		// Only a schema: file gets here: without one the reader
		// schema itself is the missing latest version.
		r.Notes = append(r.Notes, fmt.Sprintf("projection %s: no schema registered under subject %s yet: the reader schema was proved against no writer", p.Name, subject(p)))
		return nil
	}
	if err != nil {
		return fmt.Errorf("projection %s: versions of subject %s: %w", p.Name, subject(p), err)
	}
	slices.Sort(versions)
	if cfg.Writers == WritersLatest {
		versions = versions[len(versions)-1:]
	}
	for _, v := range versions {
		ss, err := cfg.Registry.SchemaByVersion(ctx, subject(p), v)
		if err != nil {
			return fmt.Errorf("projection %s: version %d of subject %s: %w", p.Name, v, subject(p), err)
		}
		if err := schemas.Resolves(reader, ss.Schema); err != nil {
			r.problem(p, "schema", "writer version %d (id %d) of subject %s does not resolve to the reader schema: %v: every event written with it would be dead-lettered; fix: make the reader schema read it (a field with a default, the writer's record name or an alias of it), or, if no event of that version is left on the topic, check only the latest (--writers latest, or run --check-writers latest)",
				v, ss.ID, subject(p), err)
		}
	}
	return nil
}

// checkFields proves every field p names against its reader schema.
func checkFields(p *projection.Projection, reader avro.Schema, r *Report) {
	rec, ok := reader.(*avro.RecordSchema)
	if !ok {
		r.problem(p, "schema", "the reader schema is a %s, want a record", reader.Type())
		return
	}
	byName := map[string]*avro.Field{}
	names := make([]string, 0, len(rec.Fields()))
	for _, f := range rec.Fields() {
		byName[f.Name()] = f
		names = append(names, f.Name())
	}
	for _, u := range p.FieldUses() {
		f, ok := byName[u.Field]
		if !ok {
			r.problem(p, u.Where, "field %q is not in the reader schema %s: %s; fix: name one of its fields (%s)%s",
				u.Field, rec.FullName(), missingEffect(u), strings.Join(names, ", "), columnHint(u))
			continue
		}
		t, nullable := projection.Nullable(f.Type())
		switch u.Use {
		case projection.UseKey:
			if nullable {
				r.problem(p, u.Where, "field %q is nullable: an event whose key is null is dead-lettered; fix: make it non-null in the schema, or key on a non-null field", u.Field)
			} else if !oneOf(t, avro.String, avro.Bytes, avro.Int, avro.Long, avro.Enum) {
				r.problem(p, u.Where, "field %q is %s: want a string, bytes, int or long aggregate id; fix: key on such a field", u.Field, typeName(f.Type()))
			}
		case projection.UseVersion:
			if nullable {
				r.problem(p, u.Where, "field %q is nullable: an event whose version is null is dead-lettered; fix: make it a non-null long", u.Field)
			} else if !oneOf(t, avro.Long, avro.Int) || logical(t) {
				r.problem(p, u.Where, "field %q is %s: want a long (or int) aggregate version; fix: name the version field", u.Field, typeName(f.Type()))
			}
		case projection.UseType:
			if nullable || !oneOf(t, avro.String, avro.Enum) || logical(t) {
				r.problem(p, u.Where, "field %q is %s: want a non-null string or enum naming the event type; fix: name the event type field", u.Field, typeName(f.Type()))
			}
		case projection.UseAdd:
			if !numeric(t) {
				r.problem(p, u.Where, "field %q is %s: add needs a numeric field (int, long, float, double, decimal); fix: name a numeric field, or use set", u.Field, typeName(f.Type()))
			} else if err := projection.Accepts(u.Column.Type, f.Type()); err != nil {
				r.problem(p, u.Where, "field %q: %v; fix: change the column's type", u.Field, stripSentinel(err))
			}
		case projection.UseColumn:
			if err := projection.Accepts(u.Column.Type, f.Type()); err != nil {
				r.problem(p, u.Where, "field %q into column %s: %v; fix: change the column's type, or name another field", u.Field, u.Column.Name, stripSentinel(err))
			}
		}
	}
}

// missingEffect says what a field missing from the reader schema does.
func missingEffect(u projection.FieldUse) string {
	switch {
	case u.Use == projection.UseKey || u.Use == projection.UseVersion || u.Use == projection.UseType:
		return "every event would be dead-lettered"
	case strings.HasPrefix(u.Where, "events."):
		typ, _, _ := strings.Cut(strings.TrimPrefix(u.Where, "events."), ".")
		return fmt.Sprintf("every %s event would be dead-lettered", typ)
	}
	return "the column would always be NULL"
}

func columnHint(u projection.FieldUse) string {
	if strings.HasPrefix(u.Where, "columns.") && u.Column.Name == u.Field {
		return ", with field: when the column's name is not the field's"
	}
	return ""
}

func oneOf(s avro.Schema, types ...avro.Type) bool { return slices.Contains(types, s.Type()) }

// numeric reports whether s is a number add can add: an int, long, float
// or double, or a decimal.
func numeric(s avro.Schema) bool {
	if l, ok := s.(avro.LogicalTypeSchema); ok && l.Logical() != nil {
		return l.Logical().Type() == avro.Decimal
	}
	return oneOf(s, avro.Int, avro.Long, avro.Float, avro.Double)
}

// logical reports whether s carries a logical type (a timestamp-millis
// long is no version).
func logical(s avro.Schema) bool {
	l, ok := s.(avro.LogicalTypeSchema)
	return ok && l.Logical() != nil
}

// typeName names an Avro type for a message.
func typeName(s avro.Schema) string {
	if inner, nullable := projection.Nullable(s); nullable {
		return "nullable " + typeName(inner)
	}
	if l, ok := s.(avro.LogicalTypeSchema); ok && l.Logical() != nil {
		return fmt.Sprintf("%s (%s)", s.Type(), l.Logical().Type())
	}
	return string(s.Type())
}

// stripSentinel drops the ErrNotAccepted prefix from a message the user
// reads.
func stripSentinel(err error) string {
	return strings.ReplaceAll(err.Error(), projection.ErrNotAccepted.Error()+": ", "")
}

// NoteNoDatabase is the note of a check run without a database.
const NoteNoDatabase = "PostgreSQL not checked (no database): column types, defaults and existing tables were not proved"

// checkDatabase runs postgres.Check, noting and skipping it when there is
// no database or (without RequireDB) it cannot be asked.
func checkDatabase(ctx context.Context, cfg Config, r *Report) error {
	if cfg.DB == nil {
		r.Notes = append(r.Notes, NoteNoDatabase)
		return nil
	}
	problems, err := postgres.Check(ctx, cfg.DB, cfg.Projections...)
	if err != nil {
		if cfg.RequireDB {
			return fmt.Errorf("check the projections against PostgreSQL: %w", err)
		}
		r.Notes = append(r.Notes, fmt.Sprintf("PostgreSQL not checked (%v): column types, defaults and existing tables were not proved", err))
		return nil
	}
	for _, err := range problems {
		r.Problems = append(r.Problems, dbProblem(cfg.Projections, err))
	}
	return nil
}

// dbProblem turns one of postgres.Check's problems into a line naming
// the fix. Its message names the projection already.
func dbProblem(projs []*projection.Projection, err error) Problem {
	msg := err.Error()
	name := ""
	for _, p := range projs {
		prefix := fmt.Sprintf("projection %q: ", p.Name)
		if strings.HasPrefix(msg, prefix) {
			name, msg = p.Name, strings.TrimPrefix(msg, prefix)
			break
		}
	}
	var fix string
	switch {
	case errors.Is(err, postgres.ErrBadDefault):
		fix = "give a default that parses as the column's type"
	case errors.Is(err, postgres.ErrBadType):
		fix = "name a type this database has"
	case errors.Is(err, postgres.ErrUnfilledColumn):
		// Its message names the fix, with the table's and column's names.
	case errors.Is(err, postgres.ErrTableMismatch):
		fix = "alter the table to match, declare the column as the table has it, or write to a new table"
	case errors.Is(err, postgres.ErrTableShared):
		fix = "give each projection its own table"
	}
	if name == "" {
		name = "(file)"
	}
	if fix != "" {
		msg += "; fix: " + fix
	}
	return Problem{Projection: name, Message: msg}
}
