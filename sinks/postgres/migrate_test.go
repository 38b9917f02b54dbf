package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/internal/testenv"
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
