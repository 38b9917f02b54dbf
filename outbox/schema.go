package outbox

import (
	"context"
	"fmt"

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
	// What a relay claims: unpublished rows in seq order.
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

// Migrate creates the outbox table projector_outbox, its indexes and its
// NOTIFY trigger in the connection's current schema when missing. It is
// idempotent and safe to run from several processes at once (it holds an
// advisory lock while it changes anything).
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
		for _, stmt := range ddl {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("outbox: migrate: %w", err)
			}
		}
		return nil
	})
}
