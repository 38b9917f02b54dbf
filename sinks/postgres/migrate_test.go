package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestMigrateWaitsForNoTransaction: migrating tables that are already
// current takes no lock that a member's open batch transaction holds
// against it, so a replica starting while another member is frozen in a
// transaction (or in a long one) neither waits for it nor queues every
// member's writes behind its own wait.
func TestMigrateWaitsForNoTransaction(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	p := demoProjection(t)
	if err := postgres.Migrate(ctx, db.Pool, p); err != nil {
		t.Fatal(err)
	}

	// What a batch transaction holds: row-exclusive locks on the tables
	// it writes.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context()) //nolint:errcheck // ends the test's hold
	if _, err := tx.Exec(ctx, `LOCK TABLE projector_offsets, projector_tombstones, projector_parked, projector_dead_letters,
		projector_dlq_audit, projector_dlq_outbox, `+pgx.Identifier{p.Table}.Sanitize()+` IN ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}

	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "1s" // a wait fails instead of hanging the test
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := postgres.Migrate(mctx, pool, p); err != nil {
		t.Fatalf("migrating current tables waited for an open transaction: %v", err)
	}
}

// TestMigrateKeepsParkedAndDeadLettersPerProjection upgrades the tables
// of an earlier release, whose parked events and dead letters were
// unique per identity and offset alone. Migrating keeps their rows, keys
// parked events by projection too, and keeps the dead letters' old
// uniqueness (which the earlier release's writes name, through a rolling
// deploy) until projections share a topic.
func TestMigrateKeepsParkedAndDeadLettersPerProjection(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	p := demoProjection(t)
	if err := postgres.Migrate(ctx, db.Pool, p); err != nil {
		t.Fatal(err)
	}
	// The earlier release's keys, and a row of each.
	for _, stmt := range []string{
		`ALTER TABLE projector_parked DROP CONSTRAINT projector_parked_pkey, ADD PRIMARY KEY (identity, topic, partition, key, version)`,
		`DROP INDEX projector_dead_letters_projection_offset`,
		`INSERT INTO projector_parked (identity, projection, topic, partition, key, version, "offset") VALUES ('id', 'accounts', 't', 0, 'a', 3, 7)`,
		`INSERT INTO projector_dead_letters (identity, projection, topic, partition, "offset", error) VALUES ('id', 'accounts', 't', 0, 8, 'bad')`,
	} {
		if _, err := db.Pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	keys := func() (parked, deadOld int, deadNew bool) {
		t.Helper()
		err := db.Pool.QueryRow(ctx, `SELECT
			(SELECT array_length(conkey, 1) FROM pg_constraint WHERE conrelid = 'projector_parked'::regclass AND contype = 'p'),
			(SELECT count(*) FROM pg_constraint WHERE conrelid = 'projector_dead_letters'::regclass AND contype = 'u' AND array_length(conkey, 1) = 4),
			to_regclass('projector_dead_letters_projection_offset') IS NOT NULL`).Scan(&parked, &deadOld, &deadNew)
		if err != nil {
			t.Fatal(err)
		}
		return parked, deadOld, deadNew
	}
	if err := postgres.Migrate(ctx, db.Pool, p); err != nil {
		t.Fatal(err)
	}
	if parked, deadOld, deadNew := keys(); parked != 6 || deadOld != 1 || !deadNew {
		t.Errorf("after migrating one projection per topic: parked key of %d columns, %d old dead-letter keys, new one %v; want 6, 1 (kept for the earlier release), true",
			parked, deadOld, deadNew)
	}
	other, err := projection.Parse(demo.SnapshotProjections, ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(ctx, db.Pool, p, other[0]); err != nil {
		t.Fatal(err)
	}
	if parked, deadOld, deadNew := keys(); parked != 6 || deadOld != 0 || !deadNew {
		t.Errorf("after migrating projections sharing a topic: parked key of %d columns, %d old dead-letter keys, new one %v; want 6, 0, true",
			parked, deadOld, deadNew)
	}
	var rows int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM projector_parked) + (SELECT count(*) FROM projector_dead_letters)`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 2 {
		t.Errorf("%d parked events and dead letters after migrating, want the 2 there were", rows)
	}
	// One record, dead-lettered for each projection of its topic.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO projector_dead_letters (identity, projection, topic, partition, "offset", error) VALUES ('id', 'last_event', 't', 0, 8, 'bad')`); err != nil {
		t.Errorf("a second projection's dead letter of one record: %v", err)
	}
}

// TestMigrateCreatesReadIndexes: the filterable and tenant columns get
// their indexes when the table is created, an existing table gets them
// when the file declares them later, and a migration that finds them
// takes no lock an open batch transaction holds.
func TestMigrateCreatesReadIndexes(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	parse := func(extra string) *projection.Projection {
		ps, err := projection.Parse([]byte(`projections:
  - name: orders
    topic: orders
    table: orders
    key: id
    mode: snapshot
`+extra+`    columns:
      id: {type: text, primary_key: true}
      org: {type: text}
      status: {type: text}
`), ".")
		if err != nil {
			t.Fatal(err)
		}
		return ps[0]
	}
	indexes := func() []string {
		rows, err := db.Pool.Query(ctx, `SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'orders'::regclass ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return defs
	}
	if err := postgres.Migrate(ctx, db.Pool, parse("")); err != nil {
		t.Fatal(err)
	}
	if got := indexes(); len(got) != 1 {
		t.Fatalf("indexes without filterable columns = %q, want the primary key's alone", got)
	}
	p := parse("    filterable: [status, id]\n    tenant: org\n")
	if err := postgres.Migrate(ctx, db.Pool, p); err != nil {
		t.Fatal(err)
	}
	got := indexes()
	wantCols := []string{"(org, id)", "(org, status, id)"}
	for _, w := range wantCols {
		found := false
		for _, d := range got {
			found = found || strings.HasSuffix(d, w)
		}
		if !found {
			t.Errorf("no index on %s among %q", w, got)
		}
	}
	if len(got) != 3 {
		t.Errorf("indexes = %q, want the primary key's and two", got)
	}

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context()) //nolint:errcheck // ends the test's hold
	if _, err := tx.Exec(ctx, `LOCK TABLE orders IN ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "1s"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool, p); err != nil {
		t.Fatalf("migrating a table whose indexes exist waited for an open transaction: %v", err)
	}
	if n := len(indexes()); n != 3 {
		t.Errorf("a second migration left %d indexes, want 3", n)
	}
}
