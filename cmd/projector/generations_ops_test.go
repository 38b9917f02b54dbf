package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/rebuild"
	"github.com/projector-dev/projector/sinks/postgres"
)

// itemsFile is a projection file of one projection, rebuilt by
// newRebuilt.
const itemsFile = `projections:
  - name: items
    topic: items.events
    table: items
    key: id
    mode: snapshot
    tombstone_retention: off
    columns:
      id:    {type: text, primary_key: true}
      label: {type: text}
`

// newRebuilt builds, with SQL and the generations store, what a completed
// rebuild of projection items of identity leaves: generation 2 live
// under the identity <identity>.items.g2 writing items__g2, generation 1
// retired in items__g1_retired, and items a view of items__g2. It returns
// the projection file.
func newRebuilt(t *testing.T, db *testenv.DB, identity string) string {
	t.Helper()
	ctx := t.Context()
	file := filepath.Join(t.TempDir(), "projections.yaml")
	if err := os.WriteFile(file, []byte(itemsFile), 0o600); err != nil {
		t.Fatal(err)
	}
	projs, err := projection.Parse([]byte(itemsFile), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(ctx, db.Pool, projs...); err != nil {
		t.Fatal(err)
	}
	if err := rebuild.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	if _, err := rebuild.NewStore(db.Pool).Ensure(ctx, identity, projs); err != nil {
		t.Fatal(err)
	}
	g2 := *projs[0]
	g2.Table = "items__g2"
	if err := postgres.Migrate(ctx, db.Pool, &g2); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`UPDATE projector_generations SET state = 'retired', retired_at = now(), retain_until = now() + interval '1 day'
			WHERE identity = $1 AND projection = 'items' AND generation = 1`,
		`INSERT INTO projector_generations (identity, projection, generation, state, table_name, physical_table, group_id,
			definition, reader_schema, definition_hash, live_at)
			SELECT identity, projection, 2, 'live', table_name, 'items__g2', $1 || '.items.g2', definition, reader_schema, definition_hash, now()
			FROM projector_generations WHERE identity = $1 AND projection = 'items' AND generation = 1`,
		`ALTER TABLE items RENAME TO items__g1_retired`,
		`CREATE VIEW items AS SELECT * FROM items__g2`,
	} {
		var args []any
		if strings.Contains(stmt, "$1") {
			args = append(args, identity)
		}
		if _, err := db.Pool.Exec(ctx, stmt, args...); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	return file
}

// startBuilding records generation 3 of items being built under the
// identity app.items.g3.
func startBuilding(t *testing.T, db *testenv.DB) {
	t.Helper()
	if _, err := db.Pool.Exec(t.Context(), `INSERT INTO projector_generations (identity, projection, generation, state, table_name,
		physical_table, group_id, definition, reader_schema, definition_hash)
		SELECT identity, projection, 3, 'building', table_name, 'items__g3', 'app.items.g3', definition, reader_schema, definition_hash
		FROM projector_generations WHERE identity = 'app' AND projection = 'items' AND generation = 2`); err != nil {
		t.Fatal(err)
	}
}

// TestStatusShowsGenerations: after a rebuild, projector status
// --identity app lists the partitions of the identity's own group, of
// the live generation's (app.items.g2) and of the generation being built
// (app.items.g3), each row naming its group and generation, in --json
// and in the table; another identity's partitions stay out.
func TestStatusShowsGenerations(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	cluster := testenv.Kafka(t, "items.events", 1)
	newRebuilt(t, db, "app")
	startBuilding(t, db)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO projector_offsets (identity, topic, partition, next_offset, owner_epoch)
		VALUES ('app', 'items.events', 0, 0, 1), ('app.items.g2', 'items.events', 0, 0, 2),
		('app.items.g3', 'items.events', 0, 0, 3), ('app.other', 'items.events', 0, 0, 4)`); err != nil {
		t.Fatal(err)
	}
	status := func(args ...string) string {
		t.Helper()
		var out, errs bytes.Buffer
		if err := Main(ctx, append([]string{"status", "--brokers", cluster.ListenAddrs()[0], "--database-url", db.URL, "--identity", "app"}, args...), &out, &errs); err != nil {
			t.Fatalf("status: %v\n%s", err, &errs)
		}
		return out.String()
	}
	var rows []struct {
		Topic           string
		OwnerEpoch      int64 `json:"owner_epoch"`
		State           string
		Group           string
		Generation      int
		Projection      string
		GenerationState string `json:"generation_state"`
	}
	out := status("--json")
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	var got []string
	for _, r := range rows {
		got = append(got, r.Group+"/"+r.Projection+"/"+r.GenerationState+"/"+string(rune('0'+r.Generation))+"/"+string(rune('0'+r.OwnerEpoch))+"/"+r.State)
	}
	want := []string{"app///1/1/ok", "app.items.g2/items/live/2/2/ok", "app.items.g3/items/building/3/3/ok"}
	if !slices.Equal(got, want) {
		t.Errorf("status --json rows (group/projection/generation state/generation/epoch/state) = %q, want %q\n%s", got, want, out)
	}
	table := status()
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if h := strings.Fields(lines[0]); len(lines) != 4 || h[0] != "GROUP" || h[len(h)-1] != "GEN" {
		t.Fatalf("status table: want a header from GROUP to GEN and 3 rows:\n%s", table)
	}
	for i, want := range [][]string{{"app", "1"}, {"app.items.g2", "2"}, {"app.items.g3", "3(building)"}} {
		if f := strings.Fields(lines[i+1]); !slices.Equal([]string{f[0], f[13]}, want) || f[12] != "ok" {
			t.Errorf("status row %q: want state ok, group and generation %q", lines[i+1], want)
		}
	}
}

// TestTombstonesForgetLiveGeneration: after a rebuild (of the default
// identity, projector), tombstones
// forget --projection items resolves the projection to its live
// generation's table, items__g2, which keys the tombstones that
// generation wrote: it forgets one there, and refuses a key whose row
// items__g2 holds.
func TestTombstonesForgetLiveGeneration(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	file := newRebuilt(t, db, "projector")
	for _, stmt := range []string{
		`INSERT INTO projector_tombstones (table_name, key, version) VALUES ('items__g2', 'gone', 3), ('items__g2', 'live', 1)`,
		`INSERT INTO items__g2 (id, label, version) VALUES ('live', 'here', 1)`,
	} {
		if _, err := db.Pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	forget := func(args ...string) (string, error) {
		var out, errs bytes.Buffer
		err := Main(ctx, append([]string{"tombstones", "forget", "--config", file, "--database-url", db.URL, "--projection", "items"}, args...), &out, &errs)
		return out.String(), err
	}
	out, err := forget("--key", "gone")
	if err != nil || !strings.Contains(out, `would forget the tombstone of key "gone" in table items__g2 (version 3`) {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	out, err = forget("--key", "gone", "--execute")
	if err != nil || !strings.Contains(out, `forgot the tombstone of key "gone" in table items__g2`) {
		t.Fatalf("forget --execute: %v\n%s", err, out)
	}
	if _, err := forget("--key", "live", "--execute"); err == nil || !strings.Contains(err.Error(), "has a row in table items__g2") {
		t.Errorf("forgetting the tombstone of a key with a row: %v, want a refusal naming items__g2", err)
	}
	var left []string
	if err := db.Pool.QueryRow(ctx, `SELECT array_agg(table_name || '/' || key ORDER BY key) FROM projector_tombstones`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if want := []string{"items__g2/live"}; !slices.Equal(left, want) {
		t.Errorf("tombstones left: %q, want %q", left, want)
	}
}

// TestDLQIncludesGenerations: dead letters are kept per identity; after
// a rebuild, dlq list, replay and purge with --identity app also select
// those of app's live generation (app.items.g2) and of the generation
// being built (app.items.g3), but not another identity's that merely
// starts with "app.", and dlq list names the identity of each.
func TestDLQIncludesGenerations(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	newRebuilt(t, db, "app")
	startBuilding(t, db)
	for i, identity := range []string{"app", "app.items.g2", "app.items.g3", "other", "app.other"} {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO projector_dead_letters (identity, projection, topic, partition, "offset", record_key, error)
			VALUES ($1, 'items', 'items.events', 0, $2, 'k', 'bad record')`, identity, i); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) string {
		t.Helper()
		var out, errs bytes.Buffer
		if err := Main(ctx, append(args, "--database-url", db.URL), &out, &errs); err != nil {
			t.Fatalf("projector %s: %v\n%s%s", strings.Join(args, " "), err, &out, &errs)
		}
		return out.String()
	}
	identities := func(args ...string) []string {
		t.Helper()
		var dls []struct{ Identity string }
		out := run(append([]string{"dlq", "list", "--json"}, args...)...)
		if err := json.Unmarshal([]byte(out), &dls); err != nil {
			t.Fatalf("dlq list --json: %v\n%s", err, out)
		}
		var ids []string
		for _, d := range dls {
			ids = append(ids, d.Identity)
		}
		return ids
	}
	if got, want := identities("--identity", "app"), []string{"app", "app.items.g2", "app.items.g3"}; !slices.Equal(got, want) {
		t.Errorf("dlq list --identity app: identities %q, want %q", got, want)
	}
	if got, want := identities("--identity", "app", "--limit", "2"), []string{"app", "app.items.g2"}; !slices.Equal(got, want) {
		t.Errorf("dlq list --identity app --limit 2: identities %q, want %q", got, want)
	}
	if got, want := identities("--identity", "app.items.g2"), []string{"app.items.g2"}; !slices.Equal(got, want) {
		t.Errorf("dlq list --identity app.items.g2: identities %q, want %q", got, want)
	}
	table := run("dlq", "list", "--identity", "app")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") || strings.Fields(lines[0])[1] != "IDENTITY" || strings.Fields(lines[2])[1] != "app.items.g2" {
		t.Errorf("dlq list --identity app: want an IDENTITY column and 3 dead letters:\n%s", table)
	}
	if out := run("dlq", "replay", "--identity", "app"); !strings.Contains(out, "would replay 3 dead letters") {
		t.Errorf("dlq replay --identity app (dry run):\n%s", out)
	}
	if out := run("dlq", "purge", "--identity", "app", "--yes"); !strings.Contains(out, "purged 3 dead letters") {
		t.Errorf("dlq purge --identity app --yes:\n%s", out)
	}
	if got, want := identities(), []string{"other", "app.other"}; !slices.Equal(got, want) {
		t.Errorf("dead letters left after the purge: %q, want %q", got, want)
	}
}

// TestMigrateLiveGeneration: after a rebuild (of the default identity,
// projector), projector migrate --config leaves the projection's table name the view of its live
// generation's table and migrates that table, without touching the
// retired one.
func TestMigrateLiveGeneration(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	file := newRebuilt(t, db, "projector")
	// The file now sets a fillfactor, which migrate gives an existing
	// table: the live generation's.
	if err := os.WriteFile(file, []byte(strings.Replace(itemsFile, "    mode: snapshot\n", "    mode: snapshot\n    fillfactor: 70\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Main(ctx, []string{"migrate", "--database-url", db.URL, "--config", file}, &out, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, &out)
	}
	var kinds []string
	if err := db.Pool.QueryRow(ctx, `SELECT array_agg(relname || ':' || relkind::text || ':' || coalesce(array_to_string(reloptions, ','), '') ORDER BY relname)
		FROM pg_class WHERE relnamespace = current_schema()::regnamespace AND relname IN ('items', 'items__g2', 'items__g1_retired')`).Scan(&kinds); err != nil {
		t.Fatal(err)
	}
	if want := []string{"items:v:", "items__g1_retired:r:fillfactor=50", "items__g2:r:fillfactor=70"}; !slices.Equal(kinds, want) {
		t.Errorf("after migrate: %q (name:kind:options), want %q", kinds, want)
	}
}
