package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Table is the outbox table, and Channel the LISTEN/NOTIFY channel its
// insert trigger notifies (the payload is the table's schema name).
const (
	Table   = "projector_outbox"
	Channel = "projector_outbox"
)

// migrationLock serialises Migrate calls of relays starting together
// ("obox").
const migrationLock = 0x6f626f78

// ddl creates the outbox. Every statement is idempotent.
var ddl = []string{
	`CREATE TABLE IF NOT EXISTS projector_outbox (
		seq            bigserial   PRIMARY KEY,
		id             text        NOT NULL,
		aggregate_type text        NOT NULL,
		aggregate_id   text        NOT NULL,
		version        bigint      NOT NULL,
		event_type     text        NOT NULL,
		topic          text        NOT NULL,
		payload        bytea,
		value          jsonb,
		tenant         text,
		source         text        NOT NULL,
		subject        text,
		event_time     timestamptz NOT NULL,
		traceparent    text,
		tracestate     text,
		created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
		published_at   timestamptz,
		error          text,
		failed_at      timestamptz,
		CONSTRAINT projector_outbox_payload_or_value CHECK ((payload IS NULL) <> (value IS NULL))
	)`,
	// Unpublished rows in seq order: what a relay claims while the index
	// of its shard count (shardIndexDDL) is not built yet.
	`CREATE INDEX IF NOT EXISTS projector_outbox_unpublished
		ON projector_outbox (seq) WHERE published_at IS NULL`,
	// What retention deletes.
	`CREATE INDEX IF NOT EXISTS projector_outbox_published
		ON projector_outbox (published_at) WHERE published_at IS NOT NULL`,
	// Aggregates held back by a row whose value could not be encoded;
	// normally empty.
	`CREATE INDEX IF NOT EXISTS projector_outbox_blocked
		ON projector_outbox (topic, aggregate_id, seq) WHERE published_at IS NULL AND error IS NOT NULL`,
	`CREATE OR REPLACE FUNCTION projector_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM pg_notify('projector_outbox', TG_TABLE_SCHEMA);
		RETURN NULL;
	END $$`,
	// One notification per inserting statement; Postgres folds identical
	// notifications of a transaction into one, delivered at commit.
	`DO $$ BEGIN
		IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'projector_outbox'::regclass AND tgname = 'projector_outbox_notify') THEN
			CREATE TRIGGER projector_outbox_notify AFTER INSERT ON projector_outbox
				FOR EACH STATEMENT EXECUTE FUNCTION projector_outbox_notify();
		END IF;
	END $$`,
}

// migratedSQL tells whether everything ddl creates exists, so that a
// relay restarting against a busy table takes no lock on it.
const migratedSQL = `SELECT to_regclass('projector_outbox') IS NOT NULL
	AND (SELECT count(*) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
	     WHERE x.indrelid = to_regclass('projector_outbox')
	     AND i.relname IN ('projector_outbox_unpublished', 'projector_outbox_published', 'projector_outbox_blocked')) = 3
	AND EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass('projector_outbox') AND tgname = 'projector_outbox_notify')`

// shardExpr is the shard of the aggregate of a row (of alias, or
// unqualified when alias is empty) among shards, in SQL. The claim and
// the shard index must spell it alike for the planner to use the index.
func shardExpr(alias string, shards int) string {
	col := "aggregate_id"
	if alias != "" {
		col = alias + "." + col
	}
	return fmt.Sprintf("((hashtextextended(%s, 0) %% %d) + %d) %% %d", col, shards, shards, shards)
}

// shardIndexName is the index of the unpublished rows by shard and seq
// for a shard count.
func shardIndexName(shards int) string {
	return fmt.Sprintf("projector_outbox_unpublished_shards_%d", shards)
}

// shardIndexDDL creates the index a relay with this shard count claims
// with: per owned shard, its unpublished rows in seq order, so that a
// claim reads its own shards' rows only, however far the others lag.
func shardIndexDDL(shards int, concurrently bool) string {
	how := ""
	if concurrently {
		how = "CONCURRENTLY "
	}
	return fmt.Sprintf(`CREATE INDEX %sIF NOT EXISTS %s ON projector_outbox ((%s), seq) WHERE published_at IS NULL`,
		how, shardIndexName(shards), shardExpr("", shards))
}

// Migrate creates the outbox table projector_outbox, its indexes and its
// NOTIFY trigger in the connection's current schema when missing. It is
// idempotent and safe to run from several processes at once (it holds an
// advisory lock while it changes anything).
//
// The claim index of the default shard count is created with the table.
// A relay whose shard count has no claim index (another count, or a table
// created by an older version) builds it in the background with CREATE
// INDEX CONCURRENTLY, which does not block writers, and claims without it
// meanwhile: Migrate never waits for an index build on a table in use.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	var done bool
	if err := pool.QueryRow(ctx, migratedSQL).Scan(&done); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	if done {
		return nil
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock); err != nil {
			return fmt.Errorf("outbox: migrate: lock: %w", err)
		}
		var existed bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass('projector_outbox') IS NOT NULL`).Scan(&existed); err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
		stmts := ddl
		if !existed {
			// An empty table: the index costs nothing to build now.
			stmts = append(slices.Clip(ddl), shardIndexDDL(DefaultShards, false))
		}
		for _, stmt := range stmts {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("outbox: migrate: %w", err)
			}
		}
		return nil
	})
}

// errIndexBusy says another process is building the shard index.
var errIndexBusy = errors.New("another process is building the index")

// ensureShardIndex builds the claim index of a shard count when it is
// missing, or invalid (a concurrent build that was interrupted), without
// blocking writers; building, when set, hears that a build starts. It
// reports whether the index is ready; errIndexBusy
// when another process is building it. Builds are serialised by an
// advisory lock that is only tried, never waited for: a build waits for
// every transaction older than it, and a session waiting for the lock
// would be one.
func ensureShardIndex(ctx context.Context, pool *pgxpool.Pool, shards int, building func()) (ready bool, err error) {
	name := shardIndexName(shards)
	valid := func() (exists, ok bool, err error) {
		err = pool.QueryRow(ctx, `SELECT x.indisvalid FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
			WHERE x.indrelid = 'projector_outbox'::regclass AND i.relname = $1`, name).Scan(&ok)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, false, nil
		}
		return err == nil, ok, err
	}
	if _, ok, err := valid(); err != nil || ok {
		return ok, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext('projector_outbox.index:' || 'projector_outbox'::regclass::oid), $1)`, shards).Scan(&got); err != nil {
		return false, fmt.Errorf("index %s: lock: %w", name, err)
	}
	if !got {
		return false, fmt.Errorf("index %s: %w", name, errIndexBusy)
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, uerr := conn.Exec(uctx, `SELECT pg_advisory_unlock(hashtext('projector_outbox.index:' || 'projector_outbox'::regclass::oid), $1)`, shards); uerr != nil {
			conn.Conn().Close(uctx) // the session's end releases the lock
		}
	}()
	// Checked again under the lock: it may have been built meanwhile.
	exists, ok, err := valid()
	if err != nil || ok {
		return ok, err
	}
	if exists {
		if _, err := conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+name); err != nil {
			return false, fmt.Errorf("drop the invalid index %s: %w", name, err)
		}
	}
	if building != nil {
		building()
	}
	if _, err := conn.Exec(ctx, shardIndexDDL(shards, true)); err != nil {
		return false, fmt.Errorf("create index %s: %w", name, err)
	}
	return true, nil
}
