package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

const identity = "ident"

func demoProjection(t *testing.T) *projection.Projection {
	t.Helper()
	ps, err := projection.Parse(demo.Projections, ".")
	if err != nil {
		t.Fatalf("parse demo projections: %v", err)
	}
	return ps[0]
}

// readingRows gives p a Go fold doing what its own does, so that the sink
// reads and caches p's rows (it does not for a declarative snapshot
// projection, whose fold builds rows from the event alone).
func readingRows(p *projection.Projection) *projection.Projection {
	fold := p.Compiled()
	p.Fold = func(r projection.Row, ev projection.Event) (projection.Row, error) { return fold(r, ev) }
	return p
}

func parseOne(t *testing.T, src string) *projection.Projection {
	t.Helper()
	ps, err := projection.Parse([]byte(src), ".")
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return ps[0]
}

const typedYAML = `projections:
  - name: typed
    topic: typed.events
    table: typed
    key: id
    mode: snapshot
    columns:
      id:    {type: text, primary_key: true}
      big:   {type: bigint}
      small: {type: integer}
      score: {type: double precision}
      ok:    {type: boolean}
      name:  {type: text}
      at:    {type: timestamptz}
      data:  {type: bytea}
`

// env is one projection migrated into a fresh schema, with its sink and
// offset store for one identity.
type env struct {
	t    *testing.T
	ctx  context.Context
	db   *testenv.DB
	p    *projection.Projection
	offs *postgres.Offsets
	sink *postgres.Sink
	tp   sinks.TP
}

func newEnv(t *testing.T, p *projection.Projection) *env {
	t.Helper()
	return newEnvOn(t, p, testenv.NewDB(t))
}

// newEnvOn is newEnv on db.
func newEnvOn(t *testing.T, p *projection.Projection, db *testenv.DB) *env {
	t.Helper()
	ctx := t.Context()
	if err := postgres.Migrate(ctx, db.Pool, p); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return &env{
		t: t, ctx: ctx, db: db, p: p,
		offs: postgres.NewOffsets(db.Pool, identity),
		sink: postgres.NewSink(db.Pool, identity, p, ""),
		tp:   sinks.TP{Topic: p.Topic, Partition: 0},
	}
}

// claim claims the partition, storing start as its first offset when it
// has none.
func (e *env) claim(start int64) sinks.Claim {
	e.t.Helper()
	cs, err := e.offs.Claim(e.ctx, []sinks.TP{e.tp})
	if err != nil || len(cs) != 1 {
		e.t.Fatalf("claim: %v, %v", cs, err)
	}
	c := cs[0]
	if c.NextOffset == nil {
		if err := e.offs.Init(e.ctx, c, start); err != nil {
			e.t.Fatalf("init: %v", err)
		}
		return sinks.Claim{TP: c.TP, Epoch: c.Epoch, NextOffset: start, Since: c.At}
	}
	return sinks.Claim{TP: c.TP, Epoch: c.Epoch, NextOffset: *c.NextOffset, Since: c.At}
}

func (e *env) commit(c sinks.Claim, end int64, ch sinks.Changes) error {
	return e.sink.CommitBatch(e.ctx, c, end, sinks.Keys{}, func(sinks.State) (sinks.Changes, error) { return ch, nil })
}

func (e *env) mustCommit(c *sinks.Claim, end int64, ch sinks.Changes) {
	e.t.Helper()
	if err := e.commit(*c, end, ch); err != nil {
		e.t.Fatalf("commit: %v", err)
	}
	c.NextOffset = end
}

// load reads the state of keys through CommitBatch's plan callback with an
// empty batch that leaves the offset where it is.
func (e *env) load(c sinks.Claim, keys, parkedKeys []string) sinks.State {
	e.t.Helper()
	var (
		st     sinks.State
		called bool
	)
	err := e.sink.CommitBatch(e.ctx, c, c.NextOffset, sinks.Keys{All: keys, Parked: parkedKeys}, func(s sinks.State) (sinks.Changes, error) {
		st, called = s, true
		return sinks.Changes{}, nil
	})
	if err != nil || !called {
		e.t.Fatalf("load: err %v, plan called %v", err, called)
	}
	return st
}

// stored returns the partition's stored offset and epoch.
func (e *env) stored() (*int64, int64) {
	e.t.Helper()
	list, err := e.offs.List(e.ctx)
	if err != nil {
		e.t.Fatalf("list offsets: %v", err)
	}
	for _, s := range list {
		if s.TP == e.tp {
			return s.NextOffset, s.Epoch
		}
	}
	e.t.Fatalf("partition %v not stored: %v", e.tp, list)
	return nil, 0
}

func (e *env) wantOffset(want int64) {
	e.t.Helper()
	next, _ := e.stored()
	if next == nil || *next != want {
		e.t.Errorf("stored offset = %v, want %d", ptrString(next), want)
	}
}

func ptrString(p *int64) string {
	if p == nil {
		return "NULL"
	}
	return strconv.FormatInt(*p, 10)
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.db.Pool.QueryRow(e.ctx, sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

type account struct {
	owner   *string
	balance *int64
	version int64
}

// account reads one row of the demo table; ok is false when absent.
func (e *env) account(id string) (account, bool) {
	e.t.Helper()
	var a account
	err := e.db.Pool.QueryRow(e.ctx, `SELECT owner, balance, version FROM accounts WHERE account_id = $1`, id).
		Scan(&a.owner, &a.balance, &a.version)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, false
	}
	if err != nil {
		e.t.Fatalf("read account %s: %v", id, err)
	}
	return a, true
}

func accountRow(id, owner string, balance int64) projection.Row {
	return projection.Row{"account_id": id, "owner": owner, "balance": balance, "opened_at": nil}
}

func upsert(id string, version int64, owner string, balance int64) sinks.RowWrite {
	return sinks.RowWrite{Key: id, Version: version, Row: accountRow(id, owner, balance)}
}

func TestMigrateCreatesTables(t *testing.T) {
	p := demoProjection(t)
	e := newEnv(t, p)
	for _, table := range []string{"projector_offsets", "projector_tombstones", "projector_parked", "projector_dead_letters", "accounts"} {
		var exists bool
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || !exists {
			t.Errorf("table %s: exists %v, err %v", table, exists, err)
		}
	}
	rows, err := e.db.Pool.Query(e.ctx, `SELECT column_name::text, data_type::text FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'accounts' ORDER BY ordinal_position`, e.db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	type col struct{ name, typ string }
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (col, error) {
		var c col
		return c, r.Scan(&c.name, &c.typ)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []col{{"account_id", "text"}, {"owner", "text"}, {"balance", "bigint"}, {"opened_at", "timestamp with time zone"}, {"version", "bigint"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("accounts columns = %v, want %v", got, want)
	}
	var pk []string
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT array_agg(a.attname::text) FROM pg_index i
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
		WHERE i.indrelid = 'accounts'::regclass AND i.indisprimary`).Scan(&pk); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(pk, []string{"account_id"}) {
		t.Errorf("primary key = %v, want [account_id]", pk)
	}

	// Again, and with more projections: nothing to do, no error.
	typed := parseOne(t, typedYAML)
	for i := range 2 {
		if err := postgres.Migrate(e.ctx, e.db.Pool, p, typed); err != nil {
			t.Fatalf("migrate run %d: %v", i+2, err)
		}
	}
	// The existing table was kept, not recreated.
	c := e.claim(0)
	e.mustCommit(&c, 1, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 1)}})
	if err := postgres.Migrate(e.ctx, e.db.Pool, p, typed); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.account("a1"); !ok {
		t.Error("Migrate lost the rows of an existing table")
	}
}

// TestMigrateKeyInByteOrder checks that a created table's string key is
// compared as bytes (its index probes call no strcoll), other columns and
// keys of other types keep the database's defaults, and rows of every such
// key are inserted and then updated by it.
func TestMigrateKeyInByteOrder(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	yaml := func(name, keyType string) *projection.Projection {
		return parseOne(t, fmt.Sprintf(`projections:
  - name: %[1]s
    topic: %[1]s.events
    table: %[1]s
    key: id
    mode: snapshot
    columns:
      id:   {type: %[2]s, primary_key: true}
      note: {type: text}
`, name, keyType))
	}
	ps := []*projection.Projection{yaml("by_text", "text"), yaml("by_varchar", "varchar(40)"),
		yaml("by_charvar", "Character Varying"), yaml("by_uuid", "uuid"), yaml("by_bigint", "bigint")}
	if err := postgres.Migrate(ctx, db.Pool, ps...); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	want := map[string]string{"by_text": "C", "by_varchar": "C", "by_charvar": "C", "by_uuid": "", "by_bigint": ""}
	for table, coll := range want {
		var id, note string
		err := db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT collname::text FROM pg_collation WHERE oid = k.attcollation), ''),
			coalesce((SELECT collname::text FROM pg_collation WHERE oid = n.attcollation), '')
			FROM pg_attribute k, pg_attribute n
			WHERE k.attrelid = $1::regclass AND k.attname = 'id' AND n.attrelid = k.attrelid AND n.attname = 'note'`, table).Scan(&id, &note)
		if err != nil {
			t.Fatalf("%s: %v", table, err)
		}
		if id != coll || note != "default" {
			t.Errorf("%s: key collation %q, note %q; want %q and default", table, id, note, coll)
		}
	}
	// A row of each is inserted, then updated in place by its key.
	for _, p := range ps {
		e := newEnvOn(t, readingRows(p), db)
		c := e.claim(0)
		key := "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
		if p.Columns[0].Type == "bigint" {
			key = "42"
		}
		e.mustCommit(&c, 1, sinks.Changes{Upserts: []sinks.RowWrite{{Key: key, Version: 1, Row: projection.Row{"id": key, "note": "n"}}}})
		e.mustCommit(&c, 2, sinks.Changes{Upserts: []sinks.RowWrite{{Key: key, Version: 2, Row: projection.Row{"id": key, "note": "m"}}}})
		var note string
		if err := db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT note FROM %s WHERE id = $1::%s`, p.Table, p.Columns[0].Type), key).Scan(&note); err != nil || note != "m" {
			t.Errorf("%s: note %q, %v; want the second write", p.Table, note, err)
		}
	}
}

// TestMigrateFillfactor checks that created tables leave the room the
// projection asks for on each page (by default half of it), and that an
// existing table takes a fillfactor its projection sets but keeps its own
// when the projection leaves it to the default.
func TestMigrateFillfactor(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	byDefault := demoProjection(t)
	dense := parseOne(t, `projections:
  - name: dense
    topic: dense.events
    table: dense
    key: id
    mode: snapshot
    fillfactor: 90
    columns:
      id:   {type: text, primary_key: true}
      note: {type: text}
`)
	want := func(when string, fillfactors map[string]string) {
		t.Helper()
		if err := postgres.Migrate(ctx, db.Pool, byDefault, dense); err != nil {
			t.Fatalf("migrate %s: %v", when, err)
		}
		for table, want := range fillfactors {
			var opts []string
			if err := db.Pool.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass`, table).Scan(&opts); err != nil {
				t.Fatalf("%s: %v", table, err)
			}
			if !slices.Contains(opts, want) {
				t.Errorf("%s, %s: options %v, want %s", when, table, opts, want)
			}
		}
	}
	want("creating the tables", map[string]string{"accounts": "fillfactor=50", "dense": "fillfactor=90"})
	if _, err := db.Pool.Exec(ctx, `ALTER TABLE accounts SET (fillfactor = 80)`); err != nil {
		t.Fatal(err)
	}
	dense.Fillfactor = 70
	want("migrating again", map[string]string{"accounts": "fillfactor=80", "dense": "fillfactor=70"})
}

// TestUpdatesStayOnTheirPage checks that a created table leaves room on
// each page for the new versions of its rows while another transaction
// keeps Postgres from reclaiming the old ones, as the engine's next
// transaction does while one commits: the updates then write no index
// entry. With 80% of each page filled, only about half did.
func TestUpdatesStayOnTheirPage(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	const rows = 2000
	keys := make([]string, rows)
	for i := range keys {
		keys[i] = fmt.Sprintf("acc-%05d", i)
	}
	pages := func() map[string]int64 {
		t.Helper()
		rows, err := e.db.Pool.Query(e.ctx, `SELECT account_id, (ctid::text::point)[0]::bigint FROM accounts`)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int64{}
		for rows.Next() {
			var k string
			var page int64
			if err := rows.Scan(&k, &page); err != nil {
				t.Fatal(err)
			}
			m[k] = page
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return m
	}
	c := e.claim(0)
	if err := e.nextVersions(c, 1, keys); err != nil {
		t.Fatal(err)
	}
	before := pages()

	// A transaction that began before the updates and holds a
	// transaction id: no old version can be reclaimed while it runs.
	hold, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(e.ctx) //nolint:errcheck // only held open
	if _, err := hold.Exec(e.ctx, `SELECT txid_current()`); err != nil {
		t.Fatal(err)
	}
	var half []string // every second row: some of every page
	for i := 0; i < rows; i += 2 {
		half = append(half, keys[i])
	}
	c.NextOffset = 1
	if err := e.nextVersions(c, 2, half); err != nil {
		t.Fatal(err)
	}
	after := pages()
	moved := 0
	for _, k := range half {
		if after[k] != before[k] {
			moved++
		}
	}
	if moved > len(half)/20 {
		t.Errorf("%d of %d updated rows moved to another page (an index entry each), want at most %d", moved, len(half), len(half)/20)
	}
	if n := e.count(`SELECT count(*) FROM accounts WHERE version = 2 AND balance = 20`); n != len(half) {
		t.Errorf("%d rows updated, want %d", n, len(half))
	}
}

func TestMigrateAcceptsEquivalentTable(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	// Type aliases and extra columns are fine.
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE accounts (
		account_id text PRIMARY KEY, extra text, owner text, balance int8,
		opened_at timestamp with time zone, version bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(ctx, db.Pool, demoProjection(t)); err != nil {
		t.Fatalf("Migrate refused an equivalent table: %v", err)
	}
}

func TestMigrateRefusesMismatch(t *testing.T) {
	cases := []struct {
		name  string
		ddl   string
		names []string // in the error
	}{
		{"column of another type", `CREATE TABLE accounts (account_id text PRIMARY KEY, owner text, balance integer,
			opened_at timestamptz, version bigint NOT NULL)`, []string{"column balance", "integer"}},
		{"key column of another type", `CREATE TABLE accounts (account_id bigint PRIMARY KEY, owner text, balance bigint,
			opened_at timestamptz, version bigint NOT NULL)`, []string{"column account_id", "bigint"}},
		{"missing column", `CREATE TABLE accounts (account_id text PRIMARY KEY, owner text, balance bigint,
			version bigint NOT NULL)`, []string{"column opened_at", "missing"}},
		{"other primary key", `CREATE TABLE accounts (account_id text, owner text PRIMARY KEY, balance bigint,
			opened_at timestamptz, version bigint NOT NULL)`, []string{"column account_id", "primary key"}},
		{"no primary key", `CREATE TABLE accounts (account_id text, owner text, balance bigint,
			opened_at timestamptz, version bigint NOT NULL)`, []string{"column account_id", "primary key"}},
		{"composite primary key", `CREATE TABLE accounts (account_id text, owner text, balance bigint,
			opened_at timestamptz, version bigint NOT NULL, PRIMARY KEY (account_id, owner))`, []string{"column account_id", "primary key"}},
		{"no version column", `CREATE TABLE accounts (account_id text PRIMARY KEY, owner text, balance bigint,
			opened_at timestamptz)`, []string{"version"}},
		{"version of another type", `CREATE TABLE accounts (account_id text PRIMARY KEY, owner text, balance bigint,
			opened_at timestamptz, version integer NOT NULL)`, []string{"version"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			db := testenv.NewDB(t)
			if _, err := db.Pool.Exec(ctx, tc.ddl); err != nil {
				t.Fatal(err)
			}
			err := postgres.Migrate(ctx, db.Pool, demoProjection(t))
			if !errors.Is(err, postgres.ErrTableMismatch) {
				t.Fatalf("Migrate = %v, want ErrTableMismatch", err)
			}
			for _, w := range append([]string{`projection "accounts"`, "accounts"}, tc.names...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			// All or nothing: the engine's tables were not created either.
			var exists bool
			if err := db.Pool.QueryRow(ctx, `SELECT to_regclass('projector_offsets') IS NOT NULL`).Scan(&exists); err != nil || exists {
				t.Errorf("projector_offsets exists after a refused migration (err %v)", err)
			}
		})
	}
}

func TestMigrateSchemaQualifiedTable(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	p := demoProjection(t)
	p.Table = db.Schema + ".things"
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := postgres.Migrate(ctx, db.Pool, p); err != nil {
			t.Fatalf("migrate run %d: %v", i+1, err)
		}
	}
	e := &env{t: t, ctx: ctx, db: db, p: p, offs: postgres.NewOffsets(db.Pool, identity),
		sink: postgres.NewSink(db.Pool, identity, p, ""), tp: sinks.TP{Topic: p.Topic}}
	c := e.claim(0)
	e.mustCommit(&c, 2, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 5), upsert("a2", 1, "bob", 6)}})
	e.mustCommit(&c, 3, sinks.Changes{Deletes: []sinks.RowDelete{{Key: "a2", Version: 2}}})
	if n := e.count(`SELECT count(*) FROM things WHERE account_id = 'a1' AND balance = 5 AND version = 1`); n != 1 {
		t.Errorf("a1 rows = %d, want 1", n)
	}
	st := e.load(c, []string{"a1", "a2"}, nil)
	if st.Versions["a1"] != 1 || st.Versions["a2"] != 2 || st.Rows["a2"] != nil || st.Rows["a1"] == nil {
		t.Errorf("state = %+v, want a1 v1 with a row, a2 deleted at v2", st)
	}
}

func TestOffsets(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	if err := postgres.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	offs := postgres.NewOffsets(db.Pool, identity)
	tp0, tp1 := sinks.TP{Topic: "t", Partition: 0}, sinks.TP{Topic: "t", Partition: 1}

	if list, err := offs.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("List before any claim = %v, %v; want none", list, err)
	}
	cs, err := offs.Claim(ctx, []sinks.TP{tp1, tp0})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 {
		t.Fatalf("claimed %d partitions, want 2", len(cs))
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].Partition < cs[j].Partition })
	for i, c := range cs {
		if c.TP != (sinks.TP{Topic: "t", Partition: int32(i)}) || c.Epoch != 1 || c.NextOffset != nil {
			t.Errorf("first claim %d = %+v (next %s), want epoch 1 and no offset", i, c, ptrString(c.NextOffset))
		}
	}
	if err := offs.Init(ctx, cs[0], 100); err != nil {
		t.Fatalf("Init: %v", err)
	}
	if err := offs.Init(ctx, cs[1], 0); err != nil {
		t.Fatalf("Init: %v", err)
	}

	again, err := offs.Claim(ctx, []sinks.TP{tp0})
	if err != nil || len(again) != 1 {
		t.Fatalf("second claim: %v, %v", again, err)
	}
	if again[0].Epoch != 2 || again[0].NextOffset == nil || *again[0].NextOffset != 100 {
		t.Errorf("second claim = %+v (next %s), want epoch 2 and offset 100", again[0], ptrString(again[0].NextOffset))
	}
	// The first owner's epoch is stale now.
	if err := offs.Init(ctx, cs[0], 5); !errors.Is(err, sinks.ErrFenced) {
		t.Errorf("Init with a stale epoch = %v, want ErrFenced", err)
	}

	list, err := offs.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].TP != tp0 || list[1].TP != tp1 {
		t.Fatalf("List = %+v, want t/0 and t/1 in order", list)
	}
	if list[0].Epoch != 2 || list[0].NextOffset == nil || *list[0].NextOffset != 100 {
		t.Errorf("t/0 stored = epoch %d offset %s, want epoch 2 offset 100 (the stale Init changed nothing)", list[0].Epoch, ptrString(list[0].NextOffset))
	}
	if list[1].Epoch != 1 || list[1].NextOffset == nil || *list[1].NextOffset != 0 {
		t.Errorf("t/1 stored = epoch %d offset %s, want epoch 1 offset 0", list[1].Epoch, ptrString(list[1].NextOffset))
	}

	// Another identity has positions of its own.
	other := postgres.NewOffsets(db.Pool, "other")
	oc, err := other.Claim(ctx, []sinks.TP{tp0})
	if err != nil || len(oc) != 1 || oc[0].Epoch != 1 || oc[0].NextOffset != nil {
		t.Errorf("other identity's claim = %+v, %v; want epoch 1 and no offset", oc, err)
	}
	if l, err := other.List(ctx); err != nil || len(l) != 1 {
		t.Errorf("other identity's List = %v, %v; want its one partition", l, err)
	}
}

func TestCommitBatchUpsertRoundTrip(t *testing.T) {
	p := readingRows(parseOne(t, typedYAML))
	e := newEnv(t, p)
	at := time.Date(2026, 2, 3, 4, 5, 6, 789012000, time.UTC)
	events := []projection.Event{
		{Key: "k1", Version: 1, Fields: map[string]any{
			"big": int64(math.MaxInt64), "small": int32(-7), "score": 1.0 / 3, "ok": true,
			"name": "héllo, 'world'\n\"x\"", "at": at, "data": []byte{0x00, 0x01, 0xfe, 0xff},
		}},
		{Key: "k2", Version: 2, Fields: map[string]any{}}, // every value NULL
		{Key: "k3", Version: 3, Fields: map[string]any{
			"big": int64(math.MinInt64), "small": int32(0), "score": math.Inf(-1), "ok": false,
			"name": "", "at": at.Add(-time.Hour), "data": []byte{},
		}},
	}
	var ups []sinks.RowWrite
	rows := map[string]projection.Row{}
	for _, ev := range events {
		row, err := p.Apply(nil, ev)
		if err != nil {
			t.Fatal(err)
		}
		rows[ev.Key] = row
		ups = append(ups, sinks.RowWrite{Key: ev.Key, Version: ev.Version, Row: row})
	}

	c := e.claim(10)
	err := e.sink.CommitBatch(e.ctx, c, 13, sinks.Keys{All: []string{"k1", "k2", "k3"}}, func(st sinks.State) (sinks.Changes, error) {
		if len(st.Rows) != 0 || len(st.Versions) != 0 || len(st.Parked) != 0 {
			t.Errorf("state of new aggregates = %+v, want empty", st)
		}
		return sinks.Changes{Upserts: ups}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c.NextOffset = 13
	e.wantOffset(13)

	type typedRow struct {
		big     *int64
		small   *int32
		score   *float64
		ok      *bool
		name    *string
		at      *time.Time
		data    []byte
		version int64
	}
	read := func(id string) typedRow {
		t.Helper()
		var r typedRow
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT big, small, score, ok, name, at, data, version FROM typed WHERE id = $1`, id).
			Scan(&r.big, &r.small, &r.score, &r.ok, &r.name, &r.at, &r.data, &r.version); err != nil {
			t.Fatalf("read %s: %v", id, err)
		}
		return r
	}
	check := func(version1, version3 int64) {
		t.Helper()
		r := read("k1")
		if r.big == nil || *r.big != math.MaxInt64 || r.small == nil || *r.small != -7 || r.score == nil || *r.score != 1.0/3 ||
			r.ok == nil || !*r.ok || r.name == nil || *r.name != "héllo, 'world'\n\"x\"" || r.at == nil || !r.at.Equal(at) ||
			!bytes.Equal(r.data, []byte{0x00, 0x01, 0xfe, 0xff}) || r.version != version1 {
			t.Errorf("k1 stored as %+v (at %v, data %x)", r, r.at, r.data)
		}
		r = read("k2")
		if r.big != nil || r.small != nil || r.score != nil || r.ok != nil || r.name != nil || r.at != nil || r.data != nil || r.version != 2 {
			t.Errorf("k2 stored as %+v, want NULLs at version 2", r)
		}
		r = read("k3")
		if r.big == nil || *r.big != math.MinInt64 || r.small == nil || *r.small != 0 || r.score == nil || !math.IsInf(*r.score, -1) ||
			r.ok == nil || *r.ok || r.name == nil || *r.name != "" || r.at == nil || !r.at.Equal(at.Add(-time.Hour)) ||
			r.data == nil || len(r.data) != 0 || r.version != version3 {
			t.Errorf("k3 stored as %+v (at %v, data %x)", r, r.at, r.data)
		}
	}
	check(1, 3)

	// Loading gives the rows back in Row form; writing them back unchanged
	// keeps every value.
	err = e.sink.CommitBatch(e.ctx, c, 14, sinks.Keys{All: []string{"k1", "k2", "k3", "absent"}}, func(st sinks.State) (sinks.Changes, error) {
		if want := map[string]int64{"k1": 1, "k2": 2, "k3": 3}; !reflect.DeepEqual(st.Versions, want) {
			t.Errorf("versions = %v, want %v", st.Versions, want)
		}
		if len(st.Rows) != 3 {
			t.Errorf("loaded %d rows, want 3", len(st.Rows))
		}
		for id, want := range rows {
			got := st.Rows[id]
			for col, w := range want {
				if col == "at" {
					continue
				}
				if !reflect.DeepEqual(got[col], w) {
					t.Errorf("%s.%s loaded as %#v, want %#v", id, col, got[col], w)
				}
			}
			// timestamptz comes back in Postgres text form: compare in SQL.
			if want["at"] == nil {
				if got["at"] != nil {
					t.Errorf("%s.at loaded as %#v, want nil", id, got["at"])
				}
				continue
			}
			var same bool
			if err := e.db.Pool.QueryRow(e.ctx, `SELECT $1::timestamptz = $2::timestamptz`, got["at"], want["at"]).Scan(&same); err != nil || !same {
				t.Errorf("%s.at loaded as %#v, want the instant %v (err %v)", id, got["at"], want["at"], err)
			}
		}
		return sinks.Changes{Upserts: []sinks.RowWrite{
			{Key: "k1", Version: 4, Row: st.Rows["k1"]},
			{Key: "k3", Version: 5, Row: st.Rows["k3"]},
		}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	check(4, 5)
	e.wantOffset(14)
}

// TestCommitBatchTimestamptzForms writes timestamptz values in the forms
// rows hold them (RFC 3339 from events, Postgres's own rendering from
// loaded rows, times from Go folds) and in forms only Postgres parses, by
// insert and by update, and wants each stored as Postgres itself reads the
// value's text.
func TestCommitBatchTimestamptzForms(t *testing.T) {
	p := parseOne(t, typedYAML)
	e := newEnv(t, p)
	nanos := time.Date(2026, 2, 3, 4, 5, 6, 789012600, time.UTC)
	forms := []any{
		"2026-02-03T04:05:06.789012Z",
		"2026-02-03T04:05:06+05:30",
		"2026-02-03T04:05:06.7890126Z", // below a microsecond: Postgres rounds
		"2026-02-03 04:05:06+00",
		"2026-02-03 04:05:06.5+05:30",
		"2026-02-03 04:05:06-03",
		"2026-02-03 23:59:60Z", // a leap second: Postgres rolls over
		"2026-02-03",
		"2026-02-03 04:05:06 Europe/Paris",
		"infinity",
		"-infinity",
		"9999-12-31T23:59:59Z",
		"10000-01-01T00:00:00Z",
		time.Date(2026, 2, 3, 4, 5, 6, 789012000, time.FixedZone("x", 3600)),
		nanos,
	}
	text := func(v any) string {
		if tm, ok := v.(time.Time); ok {
			return tm.Format(time.RFC3339Nano)
		}
		return v.(string)
	}
	keys := make([]string, len(forms))
	for i := range forms {
		keys[i] = fmt.Sprintf("t%02d", i)
	}
	c := e.claim(0)
	for round := range 2 { // insert, then update with every form moved to another row
		var ups []sinks.RowWrite
		for i, k := range keys {
			v := forms[(i+round)%len(forms)]
			ups = append(ups, sinks.RowWrite{Key: k, Version: int64(round + 1), Row: projection.Row{"id": k, "at": v}})
		}
		// The keys are read first: the second round updates rows known
		// to exist (the statement that differs from the first round's).
		err := e.sink.CommitBatch(e.ctx, c, int64(round+1), sinks.Keys{All: keys}, func(st sinks.State) (sinks.Changes, error) {
			if len(st.Rows) != round*len(keys) {
				t.Errorf("round %d: %d rows exist, want %d", round, len(st.Rows), round*len(keys))
			}
			return sinks.Changes{Upserts: ups}, nil
		})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		c.NextOffset = int64(round + 1)
		for _, w := range ups {
			var same bool
			var stored string
			err := e.db.Pool.QueryRow(e.ctx, `SELECT at = $2::timestamptz, at::text FROM typed WHERE id = $1 AND version = $3`,
				w.Key, text(w.Row["at"]), w.Version).Scan(&same, &stored)
			if err != nil || !same {
				t.Errorf("round %d: %s = %#v stored as %s, want %s::timestamptz (err %v)", round, w.Key, w.Row["at"], stored, text(w.Row["at"]), err)
			}
		}
	}
}

// bigintKeyYAML is a projection whose key column is not text.
const bigintKeyYAML = `projections:
  - name: numbered
    topic: numbered.events
    table: numbered
    key: id
    mode: snapshot
    columns:
      id:   {type: bigint, primary_key: true}
      note: {type: text}
`

func TestCommitBatchBigintKey(t *testing.T) {
	p := readingRows(parseOne(t, bigintKeyYAML))
	e := newEnv(t, p)
	c := e.claim(0)
	row, err := p.Apply(nil, projection.Event{Key: "42", Version: 1, Fields: map[string]any{"note": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	e.mustCommit(&c, 1, sinks.Changes{Upserts: []sinks.RowWrite{
		{Key: "42", Version: 1, Row: row},
		{Key: "7", Version: 1, Row: projection.Row{"id": int64(7), "note": "seven"}},
	}})
	st := e.load(c, []string{"42", "7", "8"}, nil)
	if !reflect.DeepEqual(st.Rows["42"], projection.Row{"id": int64(42), "note": "hi"}) || st.Versions["42"] != 1 || len(st.Rows) != 2 {
		t.Errorf("state = %+v, want rows 42 and 7", st)
	}
	e.mustCommit(&c, 2, sinks.Changes{Deletes: []sinks.RowDelete{{Key: "42", Version: 2}}})
	if n := e.count(`SELECT count(*) FROM numbered`); n != 1 {
		t.Errorf("%d rows after deleting 42, want 1", n)
	}
	st = e.load(c, []string{"42"}, nil)
	if st.Versions["42"] != 2 || st.Rows["42"] != nil {
		t.Errorf("state after delete = %+v, want version 2 and no row", st)
	}
}

func TestCommitBatchDeleteKeepsVersion(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)
	e.mustCommit(&c, 2, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10), upsert("a2", 2, "bob", 20)}})
	e.mustCommit(&c, 3, sinks.Changes{Deletes: []sinks.RowDelete{{Key: "a1", Version: 4}}})
	if _, ok := e.account("a1"); ok {
		t.Error("a1 still has a row after its delete")
	}
	if a, ok := e.account("a2"); !ok || a.version != 2 || *a.balance != 20 {
		t.Errorf("a2 = %+v (present %v), want untouched", a, ok)
	}
	e.wantOffset(3)

	st := e.load(c, []string{"a1", "a2"}, nil)
	if st.Versions["a1"] != 4 {
		t.Errorf("deleted a1's version = %d, want 4 (kept by its tombstone)", st.Versions["a1"])
	}
	if _, ok := st.Rows["a1"]; ok {
		t.Errorf("deleted a1 loaded with a row %v", st.Rows["a1"])
	}
	if st.Versions["a2"] != 2 || !reflect.DeepEqual(st.Rows["a2"], accountRow("a2", "bob", 20)) {
		t.Errorf("a2 loaded as %v v%d", st.Rows["a2"], st.Versions["a2"])
	}

	// An older delete does not lower the tombstone's version.
	e.mustCommit(&c, 4, sinks.Changes{Deletes: []sinks.RowDelete{{Key: "a1", Version: 3}}})
	if st := e.load(c, []string{"a1"}, nil); st.Versions["a1"] != 4 {
		t.Errorf("a1's version after an older delete = %d, want 4", st.Versions["a1"])
	}

	// The aggregate can come back with a newer version.
	e.mustCommit(&c, 5, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 5, "ann2", 1)}})
	st = e.load(c, []string{"a1"}, nil)
	if st.Versions["a1"] != 5 || !reflect.DeepEqual(st.Rows["a1"], accountRow("a1", "ann2", 1)) {
		t.Errorf("recreated a1 = %v v%d, want its new row at v5", st.Rows["a1"], st.Versions["a1"])
	}

	// A later delete raises the tombstone.
	e.mustCommit(&c, 6, sinks.Changes{Deletes: []sinks.RowDelete{{Key: "a1", Version: 6}}})
	if st := e.load(c, []string{"a1"}, nil); st.Versions["a1"] != 6 || st.Rows["a1"] != nil {
		t.Errorf("a1 after the second delete = %v v%d, want no row at v6", st.Rows["a1"], st.Versions["a1"])
	}

	// Whatever the row holds, the version reported is never below the
	// tombstone's.
	e.mustCommit(&c, 7, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 3, "late", 3)}})
	if st := e.load(c, []string{"a1"}, nil); st.Versions["a1"] != 6 {
		t.Errorf("a1's version with a tombstone at v6 and a row at v3 = %d, want 6", st.Versions["a1"])
	}
}

func sortParked(evs []sinks.StoredEvent) {
	slices.SortFunc(evs, func(a, b sinks.StoredEvent) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return int(a.Version - b.Version)
	})
}

func TestCommitBatchParked(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	ts := time.Date(2026, 1, 2, 3, 4, 5, 678000, time.UTC)
	e1 := sinks.StoredEvent{Key: "a1", Version: 3, Offset: 10, RecordKey: []byte("a1"), Value: []byte{0, 1, 2, 0xff},
		Headers: []sinks.Header{{Key: "trace", Value: []byte("abc")}, {Key: "bin", Value: []byte{0, 0xff}}}, Timestamp: ts}
	e2 := sinks.StoredEvent{Key: "a1", Version: 4, Offset: 11, Value: []byte("x")}
	e3 := sinks.StoredEvent{Key: "a2", Version: 2, Offset: 12, RecordKey: []byte("a2"), Value: []byte("y"), Timestamp: ts}

	c := e.claim(10)
	e.mustCommit(&c, 13, sinks.Changes{Park: []sinks.StoredEvent{e1, e2, e3}})
	keys, err := e.sink.ParkedKeys(e.ctx, e.tp)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	if !reflect.DeepEqual(keys, []string{"a1", "a2"}) {
		t.Errorf("ParkedKeys = %v, want [a1 a2]", keys)
	}
	// Parked events belong to the identity and the partition.
	for _, other := range []struct {
		identity string
		tp       sinks.TP
	}{{"other", e.tp}, {identity, sinks.TP{Topic: e.tp.Topic, Partition: 1}}} {
		keys, err := postgres.NewSink(e.db.Pool, other.identity, e.p, "").ParkedKeys(e.ctx, other.tp)
		if err != nil || len(keys) != 0 {
			t.Errorf("ParkedKeys of %s %v = %v, %v; want none", other.identity, other.tp, keys, err)
		}
	}

	if st := e.load(c, []string{"a1"}, nil); len(st.Parked) != 0 {
		t.Errorf("parked events loaded without being asked for: %+v", st.Parked)
	}
	st := e.load(c, []string{"a1"}, []string{"a1"})
	sortParked(st.Parked)
	if len(st.Parked) != 2 {
		t.Fatalf("loaded %d parked events for a1, want 2: %+v", len(st.Parked), st.Parked)
	}
	got1, got2 := st.Parked[0], st.Parked[1]
	if got1.Key != "a1" || got1.Version != 3 || got1.Offset != 10 || !bytes.Equal(got1.RecordKey, e1.RecordKey) ||
		!bytes.Equal(got1.Value, e1.Value) || !reflect.DeepEqual(got1.Headers, e1.Headers) || !got1.Timestamp.Equal(ts) {
		t.Errorf("parked a1 v3 loaded as %+v, want %+v", got1, e1)
	}
	if got2.Key != "a1" || got2.Version != 4 || got2.Offset != 11 || got2.RecordKey != nil ||
		!bytes.Equal(got2.Value, e2.Value) || len(got2.Headers) != 0 || !got2.Timestamp.IsZero() {
		t.Errorf("parked a1 v4 loaded as %+v, want %+v", got2, e2)
	}

	// Parking the same version again keeps the first copy.
	dup := e1
	dup.Offset, dup.Value = 99, []byte("other")
	e.mustCommit(&c, 14, sinks.Changes{Park: []sinks.StoredEvent{dup}})
	st = e.load(c, nil, []string{"a1", "a2"})
	sortParked(st.Parked)
	if len(st.Parked) != 3 || st.Parked[0].Offset != 10 || !bytes.Equal(st.Parked[0].Value, e1.Value) {
		t.Errorf("after parking a duplicate: %+v, want the 3 originals", st.Parked)
	}

	e.mustCommit(&c, 15, sinks.Changes{Unpark: []sinks.ParkedRef{{Key: "a1", Version: 3}}})
	st = e.load(c, nil, []string{"a1"})
	if len(st.Parked) != 1 || st.Parked[0].Version != 4 {
		t.Errorf("after unparking a1 v3: %+v, want only a1 v4", st.Parked)
	}
	keys, err = e.sink.ParkedKeys(e.ctx, e.tp)
	if slices.Sort(keys); err != nil || !reflect.DeepEqual(keys, []string{"a1", "a2"}) {
		t.Errorf("ParkedKeys = %v, %v; want [a1 a2]", keys, err)
	}
	e.mustCommit(&c, 16, sinks.Changes{Unpark: []sinks.ParkedRef{{Key: "a1", Version: 4}, {Key: "a2", Version: 2}}})
	keys, err = e.sink.ParkedKeys(e.ctx, e.tp)
	if err != nil || len(keys) != 0 {
		t.Errorf("ParkedKeys after unparking all = %v, %v; want none", keys, err)
	}
	if n := e.count(`SELECT count(*) FROM projector_parked`); n != 0 {
		t.Errorf("%d parked rows left", n)
	}
	e.wantOffset(16)
}

func TestCommitBatchDeadLetters(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	ts := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	headers := []sinks.Header{{Key: "h", Value: []byte("v")}, {Key: "b", Value: []byte{0xff, 0}}}
	c := e.claim(0)
	e.mustCommit(&c, 9, sinks.Changes{DeadLetters: []sinks.DeadLetter{
		{Offset: 7, RecordKey: []byte("a1"), Value: []byte{0xde, 0xad}, Headers: headers, Timestamp: ts, Err: "boom"},
		{Offset: 8, Err: "no key, no value"},
	}})
	dls, err := deadletters.List(e.ctx, e.db.Pool, deadletters.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 2 {
		t.Fatalf("got %d dead letters, want 2: %+v", len(dls), dls)
	}
	d := dls[0]
	if d.Identity != identity || d.Projection != "accounts" || d.Topic != demo.Topic || d.Partition != 0 || d.Offset != 7 ||
		d.Key != "a1" || !bytes.Equal(d.Value, []byte{0xde, 0xad}) || !reflect.DeepEqual(d.Headers, headers) ||
		d.RecordTime == nil || !d.RecordTime.Equal(ts) || d.Error != "boom" || d.Attempts != 1 {
		t.Errorf("first dead letter = %+v", d)
	}
	d = dls[1]
	if d.Offset != 8 || d.Key != "" || len(d.Value) != 0 || len(d.Headers) != 0 || d.RecordTime != nil || d.Error != "no key, no value" || d.Attempts != 1 {
		t.Errorf("second dead letter = %+v", d)
	}
	first := dls[0]

	// The same offset again counts an attempt instead of adding a row.
	e.mustCommit(&c, 10, sinks.Changes{DeadLetters: []sinks.DeadLetter{
		{Offset: 7, RecordKey: []byte("a1"), Value: []byte{0xde, 0xad}, Headers: headers, Timestamp: ts, Err: "boom again"},
	}})
	dls, err = deadletters.List(e.ctx, e.db.Pool, deadletters.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 2 {
		t.Fatalf("got %d dead letters after a repeat, want 2", len(dls))
	}
	d = dls[0]
	if d.ID != first.ID || d.Offset != 7 || d.Attempts != 2 || d.Error != "boom again" || d.Key != "a1" || d.LastSeen.Before(d.FirstSeen) {
		t.Errorf("repeated dead letter = %+v, want one row with 2 attempts and the latest error", d)
	}
	if dls[1].Attempts != 1 {
		t.Errorf("the other dead letter's attempts = %d, want 1", dls[1].Attempts)
	}

	for _, tc := range []struct {
		f    deadletters.Filter
		want int
	}{
		{deadletters.Filter{Identity: identity}, 2},
		{deadletters.Filter{Identity: "other"}, 0},
		{deadletters.Filter{Projection: "accounts", Topic: demo.Topic}, 2},
		{deadletters.Filter{Projection: "other"}, 0},
		{deadletters.Filter{Topic: "other"}, 0},
		{deadletters.Filter{Limit: 1}, 1},
	} {
		got, err := deadletters.List(e.ctx, e.db.Pool, tc.f)
		if err != nil || len(got) != tc.want {
			t.Errorf("ListDeadLetters(%+v) = %d rows, %v; want %d", tc.f, len(got), err, tc.want)
		}
	}
	e.wantOffset(10)
}

// nothingWritten checks a failed batch left no trace.
func (e *env) nothingWritten(offset int64) {
	e.t.Helper()
	if n := e.count(`SELECT count(*) FROM accounts`); n != 0 {
		e.t.Errorf("%d rows written", n)
	}
	if n := e.count(`SELECT count(*) FROM projector_tombstones`); n != 0 {
		e.t.Errorf("%d tombstones written", n)
	}
	if n := e.count(`SELECT count(*) FROM projector_parked`); n != 0 {
		e.t.Errorf("%d parked events written", n)
	}
	if n := e.count(`SELECT count(*) FROM projector_dead_letters`); n != 0 {
		e.t.Errorf("%d dead letters written", n)
	}
	e.wantOffset(offset)
}

func fullBatch(id string) sinks.Changes {
	return sinks.Changes{
		Upserts:     []sinks.RowWrite{upsert(id, 1, "ann", 10)},
		Deletes:     []sinks.RowDelete{{Key: id + "-gone", Version: 2}},
		Park:        []sinks.StoredEvent{{Key: id, Version: 3, Offset: 1, Value: []byte("p")}},
		DeadLetters: []sinks.DeadLetter{{Offset: 2, Err: "bad"}},
	}
}

func TestCommitBatchFenced(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	first, err := e.offs.Claim(e.ctx, []sinks.TP{e.tp})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.offs.Init(e.ctx, first[0], 0); err != nil {
		t.Fatal(err)
	}
	second, err := e.offs.Claim(e.ctx, []sinks.TP{e.tp})
	if err != nil {
		t.Fatal(err)
	}
	if first[0].Epoch != 1 || second[0].Epoch != 2 {
		t.Fatalf("epochs = %d, %d; want 1, 2", first[0].Epoch, second[0].Epoch)
	}
	stale := sinks.Claim{TP: e.tp, Epoch: 1, NextOffset: 0}
	owner := sinks.Claim{TP: e.tp, Epoch: 2, NextOffset: 0}

	if err := e.commit(stale, 5, fullBatch("a1")); !errors.Is(err, sinks.ErrFenced) {
		t.Fatalf("commit with the stale epoch = %v, want ErrFenced", err)
	}
	e.nothingWritten(0)
	if _, epoch := e.stored(); epoch != 2 {
		t.Errorf("stored epoch = %d, want 2", epoch)
	}

	wrongStart := owner
	wrongStart.NextOffset = 3
	if err := e.commit(wrongStart, 5, fullBatch("a1")); !errors.Is(err, sinks.ErrFenced) {
		t.Fatalf("commit from the wrong offset = %v, want ErrFenced", err)
	}
	e.nothingWritten(0)

	if err := e.commit(owner, 5, fullBatch("a1")); err != nil {
		t.Fatalf("the current owner's commit: %v", err)
	}
	if a, ok := e.account("a1"); !ok || a.version != 1 {
		t.Errorf("a1 = %+v (present %v), want written at v1", a, ok)
	}
	e.wantOffset(5)

	// The stale owner stays fenced, even from the current offset.
	stale.NextOffset = 5
	if err := e.commit(stale, 6, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 2, "mallory", 0)}}); !errors.Is(err, sinks.ErrFenced) {
		t.Errorf("stale owner from the current offset = %v, want ErrFenced", err)
	}
	if a, _ := e.account("a1"); a.version != 1 || *a.owner != "ann" {
		t.Errorf("a1 = %+v after a fenced commit, want unchanged", a)
	}
	e.wantOffset(5)

	// A partition never initialised has no offset to move from.
	tp1 := sinks.TP{Topic: e.tp.Topic, Partition: 1}
	cs, err := e.offs.Claim(e.ctx, []sinks.TP{tp1})
	if err != nil {
		t.Fatal(err)
	}
	err = e.commit(sinks.Claim{TP: tp1, Epoch: cs[0].Epoch, NextOffset: 0}, 1, sinks.Changes{Upserts: []sinks.RowWrite{upsert("b1", 1, "b", 1)}})
	if !errors.Is(err, sinks.ErrFenced) {
		t.Errorf("commit on an uninitialised partition = %v, want ErrFenced", err)
	}
	if _, ok := e.account("b1"); ok {
		t.Error("b1 written by a fenced commit")
	}
}

func TestCommitBatchPlanErrorRollsBack(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)
	boom := errors.New("boom")
	called := false
	err := e.sink.CommitBatch(e.ctx, c, 5, sinks.Keys{All: []string{"a1"}, Parked: []string{"a1"}}, func(sinks.State) (sinks.Changes, error) {
		called = true
		return fullBatch("a1"), boom
	})
	if !errors.Is(err, boom) || !called {
		t.Fatalf("CommitBatch = %v (plan called %v), want the plan's error", err, called)
	}
	e.nothingWritten(0)

	// The offset did not move: the batch can be committed again from 0.
	e.mustCommit(&c, 5, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10)}})
	if a, ok := e.account("a1"); !ok || a.version != 1 {
		t.Errorf("a1 = %+v (present %v) after the retried batch", a, ok)
	}
}

func TestCommitBatchWriteErrorRollsBack(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)

	// A value the sink cannot encode fails the batch before anything runs.
	bad := fullBatch("a1")
	bad.Upserts = append(bad.Upserts, sinks.RowWrite{Key: "a2", Version: 1, Row: projection.Row{"account_id": "a2", "balance": struct{}{}}})
	err := e.commit(c, 5, bad)
	if err == nil || errors.Is(err, sinks.ErrFenced) || !strings.Contains(err.Error(), `"a2"`) || !strings.Contains(err.Error(), "balance") {
		t.Errorf("commit of an unencodable value = %v, want an error naming the aggregate and column", err)
	}
	e.nothingWritten(0)

	// A value Postgres refuses fails the whole transaction.
	bad = fullBatch("a1")
	bad.Upserts = append(bad.Upserts, sinks.RowWrite{Key: "a2", Version: 1, Row: projection.Row{"account_id": "a2", "opened_at": "not a time"}})
	err = e.commit(c, 5, bad)
	if err == nil || errors.Is(err, sinks.ErrFenced) {
		t.Errorf("commit of a value Postgres refuses = %v, want a write error", err)
	}
	e.nothingWritten(0)
}

func TestCommitBatchNeverMovesBackwards(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)
	e.mustCommit(&c, 1, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 5, "ann", 50)}})
	// An older version, then the same version: neither replaces the row,
	// but the batches commit and move the offset.
	e.mustCommit(&c, 2, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 3, "old", 30), upsert("a2", 1, "bob", 1)}})
	e.mustCommit(&c, 3, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 5, "same", 55)}})
	if a, ok := e.account("a1"); !ok || a.version != 5 || *a.owner != "ann" || *a.balance != 50 {
		t.Errorf("a1 = %+v (owner %v, balance %v), want version 5 by ann with 50", a, deref(a.owner), deref(a.balance))
	}
	if a, ok := e.account("a2"); !ok || a.version != 1 {
		t.Errorf("a2 = %+v (present %v), want written beside the stale a1", a, ok)
	}
	e.wantOffset(3)
	// A newer version does replace it.
	e.mustCommit(&c, 4, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 6, "newer", 60)}})
	if a, _ := e.account("a1"); a.version != 6 || *a.owner != "newer" || *a.balance != 60 {
		t.Errorf("a1 = %+v, want version 6 by newer with 60", a)
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
