package postgres_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// oneColumn is a snapshot projection of table with an id key and a
// column c of type typ (and default def, a YAML value, unless empty).
func oneColumn(t *testing.T, name, table, typ, def string) *projection.Projection {
	t.Helper()
	if def != "" {
		def = ", default: " + def
	}
	return parseOne(t, fmt.Sprintf(`projections:
  - name: %s
    topic: %s.events
    table: %s
    key: id
    mode: snapshot
    columns:
      id: {type: text, primary_key: true}
      c:  {type: '%s'%s}
`, name, name, table, typ, def))
}

// nothingCreated fails the test when a refused Migrate left a table behind:
// the engine's own or the projection's.
func nothingCreated(t *testing.T, db *testenv.DB, tables ...string) {
	t.Helper()
	for _, table := range append([]string{"projector_offsets"}, tables...) {
		var exists bool
		if err := db.Pool.QueryRow(t.Context(), `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || exists {
			t.Errorf("table %s exists after a refused migration (err %v)", table, err)
		}
	}
}

// TestMigrateRefusesWhatIsNotAType checks that a column type carrying
// more than a type name (a constraint, a default) or naming no type is
// refused before anything is created, with an error naming the
// projection, the column and the type. Such a type used to reach CREATE
// TABLE: the constraint was created, and every statement the sink built
// with it failed as a syntax error.
func TestMigrateRefusesWhatIsNotAType(t *testing.T) {
	for _, typ := range []string{
		"text unique not null default current_user",
		"text references orders",
		"text not null",
		"bigint primary key",
		"no_such_type",
		"no_such_schema.citext",
		"void",
		"record",
	} {
		t.Run(typ, func(t *testing.T) {
			db := testenv.NewDB(t)
			p := oneColumn(t, "things", "things", typ, "")
			err := postgres.Migrate(t.Context(), db.Pool, p)
			if err == nil {
				t.Fatalf("Migrate accepted column type %q", typ)
			}
			if !errors.Is(err, postgres.ErrBadType) {
				t.Errorf("Migrate = %v, want ErrBadType", err)
			}
			for _, w := range []string{`projection "things"`, `column "c"`, typ} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			nothingCreated(t, db, "things")
		})
	}
}

// TestMigrateResolvesTypeNames checks that type names Postgres accepts
// (modifiers, multi-word names, a type of another schema, aliases) are
// resolved to the names Postgres prints, that the table is created with
// exactly those types, that rows are written and read through them, and
// that a restart, which parses the file again, accepts the table.
func TestMigrateResolvesTypeNames(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	other := testenv.NewDB(t) // a schema that is not on db's search_path
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`CREATE DOMAIN %s.email AS text CHECK (VALUE LIKE '%%@%%')`, other.Schema)); err != nil {
		t.Fatal(err)
	}
	src := fmt.Sprintf(`projections:
  - name: typed
    topic: typed.events
    table: typed
    key: id
    mode: snapshot
    columns:
      id:     {type: VARCHAR(12), primary_key: true}
      at:     {type: timestamp(3) with time zone}
      email:  {type: %s.email}
      amount: {type: 'numeric(10, 2)'}
      n:      {type: int4}
      ratio:  {type: float8}
      flag:   {type: bool}
      tags:   {type: 'text[]'}
`, other.Schema)
	want := []string{"character varying(12)", "timestamp(3) with time zone", other.Schema + ".email",
		"numeric(10,2)", "integer", "double precision", "boolean", "text[]"}
	p := parseOne(t, src)
	if err := postgres.Migrate(ctx, db.Pool, p); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	for i, c := range p.Columns {
		if c.Type != want[i] {
			t.Errorf("column %s: type %q, want %q", c.Name, c.Type, want[i])
		}
		var have string
		if err := db.Pool.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
			WHERE attrelid = 'typed'::regclass AND attname = $1`, c.Name).Scan(&have); err != nil || have != want[i] {
			t.Errorf("table column %s: %q (%v), want %q", c.Name, have, err, want[i])
		}
	}
	if kinds := []projection.Kind{p.Columns[4].Kind(), p.Columns[5].Kind(), p.Columns[6].Kind()}; kinds[0] != projection.KindInt ||
		kinds[1] != projection.KindFloat || kinds[2] != projection.KindBool {
		t.Errorf("kinds of integer, double precision, boolean = %v", kinds)
	}

	e := newEnvOn(t, readingRows(p), db)
	c := e.claim(0)
	row := projection.Row{"id": "k1", "at": "2026-01-02T03:04:05.123456Z", "email": "ann@example.com",
		"amount": "12.345", "n": int64(7), "ratio": 0.5, "flag": true, "tags": "{a,b}"}
	e.mustCommit(&c, 1, sinks.Changes{Upserts: []sinks.RowWrite{{Key: "k1", Version: 1, Row: row}}})
	if n := e.count(`SELECT count(*) FROM typed WHERE id = 'k1' AND at = '2026-01-02T03:04:05.123Z' AND email = 'ann@example.com'
		AND amount = 12.35 AND n = 7 AND ratio = 0.5 AND flag AND tags = '{a,b}' AND version = 1`); n != 1 {
		t.Errorf("row k1 not stored as written (at rounded to milliseconds, amount to cents)")
	}
	row = projection.Row{"id": "k1", "at": nil, "email": "bob@example.com", "amount": nil, "n": int64(8), "ratio": nil, "flag": false, "tags": nil}
	e.mustCommit(&c, 2, sinks.Changes{Upserts: []sinks.RowWrite{{Key: "k1", Version: 2, Row: row}}})
	if n := e.count(`SELECT count(*) FROM typed WHERE id = 'k1' AND email = 'bob@example.com' AND n = 8 AND NOT flag AND version = 2`); n != 1 {
		t.Errorf("row k1 not updated")
	}

	// A restart parses the file again and finds the table it created.
	if err := postgres.Migrate(ctx, db.Pool, parseOne(t, src)); err != nil {
		t.Fatalf("migrate on restart: %v", err)
	}
	// Migrating the resolved projection again changes nothing.
	if err := postgres.Migrate(ctx, db.Pool, p); err != nil || p.Columns[0].Type != want[0] {
		t.Fatalf("migrate again: %v (key type %q)", err, p.Columns[0].Type)
	}
}

// TestMigrateChecksDefaults checks that every default is cast to its
// column's type before anything is created: one the type refuses would
// fail the first event of every new aggregate. Defaults that fit are
// taken, in the type Postgres resolved, and start new rows.
func TestMigrateChecksDefaults(t *testing.T) {
	for _, tc := range []struct{ typ, def string }{
		{"timestamptz", `"not a time"`},
		{"uuid", "nope"},
		{"numeric(4,2)", "123.45"},
		{"date", `"2026-02-30"`},
		{"inet", "not-an-address"},
		{"int4range", `"[5,1]"`},
	} {
		t.Run(tc.typ+" "+tc.def, func(t *testing.T) {
			db := testenv.NewDB(t)
			err := postgres.Migrate(t.Context(), db.Pool, oneColumn(t, "things", "things", tc.typ, tc.def))
			if err == nil {
				t.Fatalf("Migrate accepted default %s for type %s", tc.def, tc.typ)
			}
			if !errors.Is(err, postgres.ErrBadDefault) {
				t.Errorf("Migrate = %v, want ErrBadDefault", err)
			}
			for _, w := range []string{`projection "things"`, `column "c"`, "default", strings.Trim(tc.def, `"`)} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			nothingCreated(t, db, "things")
		})
	}

	t.Run("a literal a fold sets", func(t *testing.T) {
		db := testenv.NewDB(t)
		err := postgres.Migrate(t.Context(), db.Pool, parseOne(t, `projections:
  - name: acc
    topic: acc.events
    table: acc
    key: id
    mode: fold
    type_field: type
    columns:
      id:     {type: text, primary_key: true}
      closed: {type: timestamptz}
    events:
      Closed: {set: {closed: {literal: "whenever"}}}
`))
		if !errors.Is(err, postgres.ErrBadDefault) {
			t.Fatalf("Migrate = %v, want ErrBadDefault", err)
		}
		for _, w := range []string{`projection "acc"`, `column "closed"`, "events.Closed.set", "whenever"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not mention %q", err, w)
			}
		}
		nothingCreated(t, db, "acc")
	})

	t.Run("defaults that fit", func(t *testing.T) {
		ctx := t.Context()
		db := testenv.NewDB(t)
		p := parseOne(t, `projections:
  - name: acc
    topic: acc.events
    table: acc
    key: id
    mode: fold
    type_field: type
    columns:
      id:      {type: text, primary_key: true}
      since:   {type: timestamptz, default: "2026-01-01T00:00:00Z"}
      balance: {type: pg_catalog.int8, default: 10}
      rate:    {type: pg_catalog.float8, default: 1.5}
    events:
      Deposited: {add: {balance: amount}}
`)
		if err := postgres.Migrate(ctx, db.Pool, p); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		// The fold now holds the defaults in the resolved types' kinds.
		row, err := p.Apply(nil, projection.Event{Key: "a", Version: 1, Type: "Deposited", Fields: map[string]any{"amount": int64(5)}})
		if err != nil {
			t.Fatalf("fold: %v", err)
		}
		if row["balance"] != int64(15) || row["rate"] != 1.5 {
			t.Errorf("first row = %v, want balance 15 and rate 1.5", row)
		}
		e := newEnvOn(t, p, db)
		c := e.claim(0)
		e.mustCommit(&c, 1, sinks.Changes{Upserts: []sinks.RowWrite{{Key: "a", Version: 1, Row: row}}})
		if n := e.count(`SELECT count(*) FROM acc WHERE id = 'a' AND since = '2026-01-01T00:00:00Z' AND balance = 15 AND rate = 1.5`); n != 1 {
			t.Error("the first row does not hold the defaults")
		}
	})
}

// TestMigrateRefusesTwoProjectionsOnOneTable checks that projections whose
// table names resolve to one table, as Postgres resolves them through
// search_path, are refused before anything is created, with an error
// naming both; names that only look alike are two tables.
func TestMigrateRefusesTwoProjectionsOnOneTable(t *testing.T) {
	ctx := t.Context()
	t.Run("unqualified and qualified", func(t *testing.T) {
		db := testenv.NewDB(t)
		a, b := oneColumn(t, "first", "t", "text", ""), oneColumn(t, "second", db.Schema+".t", "text", "")
		err := postgres.Migrate(ctx, db.Pool, a, b)
		if err == nil {
			t.Fatal("Migrate accepted two projections writing one table")
		}
		if !errors.Is(err, postgres.ErrTableShared) {
			t.Errorf("Migrate = %v, want ErrTableShared", err)
		}
		for _, w := range []string{`"first"`, `"second"`, db.Schema + ".t"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not mention %q", err, w)
			}
		}
		nothingCreated(t, db, "t")
	})
	t.Run("an existing table found through search_path", func(t *testing.T) {
		db := testenv.NewDB(t)
		if _, err := db.Pool.Exec(ctx, `CREATE TABLE t (id text PRIMARY KEY, c text, version bigint NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		err := postgres.Migrate(ctx, db.Pool, oneColumn(t, "first", db.Schema+".t", "text", ""), oneColumn(t, "second", "t", "text", ""))
		if !errors.Is(err, postgres.ErrTableShared) || !strings.Contains(err.Error(), `"first"`) || !strings.Contains(err.Error(), `"second"`) {
			t.Errorf("Migrate = %v, want ErrTableShared naming both projections", err)
		}
	})
	t.Run("one name in two schemas", func(t *testing.T) {
		db, other := testenv.NewDB(t), testenv.NewDB(t)
		if err := postgres.Migrate(ctx, db.Pool, oneColumn(t, "first", "t", "text", ""), oneColumn(t, "second", other.Schema+".t", "text", "")); err != nil {
			t.Fatalf("Migrate refused two tables of one name in two schemas: %v", err)
		}
	})
}
