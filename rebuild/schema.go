package rebuild

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ddl creates the tables of generations and rebuild operations. Every
// statement is idempotent.
var ddl = []string{
	`CREATE TABLE IF NOT EXISTS projector_generations (
		identity        text        NOT NULL,
		projection      text        NOT NULL,
		generation      integer     NOT NULL,
		state           text        NOT NULL,
		table_name      text        NOT NULL,
		physical_table  text        NOT NULL,
		group_id        text        NOT NULL,
		definition      text        NOT NULL,
		reader_schema   text        NOT NULL DEFAULT '',
		definition_hash text        NOT NULL,
		created_at      timestamptz NOT NULL DEFAULT now(),
		live_at         timestamptz,
		retired_at      timestamptz,
		retain_until    timestamptz,
		dropped_at      timestamptz,
		PRIMARY KEY (identity, projection, generation)
	)`,
	`CREATE UNIQUE INDEX IF NOT EXISTS projector_generations_live
		ON projector_generations (identity, projection) WHERE state = 'live'`,
	`CREATE TABLE IF NOT EXISTS projector_rebuilds (
		id                    uuid        PRIMARY KEY,
		identity              text        NOT NULL,
		projection            text        NOT NULL,
		kind                  text        NOT NULL,
		generation            integer     NOT NULL,
		from_generation       integer     NOT NULL,
		state                 text        NOT NULL,
		allow_partial_history boolean     NOT NULL DEFAULT false,
		deleted_records       jsonb,
		actor                 text        NOT NULL DEFAULT '',
		error_code            text        NOT NULL DEFAULT '',
		error_message         text        NOT NULL DEFAULT '',
		waiting               text        NOT NULL DEFAULT '',
		records_done          bigint      NOT NULL DEFAULT 0,
		records_remaining     bigint,
		rate                  double precision,
		arrival_rate          double precision,
		created_at            timestamptz NOT NULL DEFAULT now(),
		started_at            timestamptz,
		cutover_at            timestamptz,
		finished_at           timestamptz,
		updated_at            timestamptz NOT NULL DEFAULT now(),
		cleaned_at            timestamptz,
		retain_seconds        bigint      NOT NULL DEFAULT 86400
	)`,
	// Who asked beside the actor given: the operating-system user of the
	// command and the database session user of the transaction that
	// recorded the operation, and the same of whoever cancelled it. Added
	// only when missing: ALTER TABLE locks the table even with nothing to
	// do, and engines read it while they run.
	`DO $$ BEGIN
		IF (SELECT count(*) FROM pg_attribute WHERE attrelid = 'projector_rebuilds'::regclass AND NOT attisdropped
		    AND attname IN ('os_user', 'db_user', 'cancelled_by', 'cancelled_os_user', 'cancelled_db_user')) < 5 THEN
			ALTER TABLE projector_rebuilds
				ADD COLUMN IF NOT EXISTS os_user           text NOT NULL DEFAULT '',
				ADD COLUMN IF NOT EXISTS db_user           text NOT NULL DEFAULT session_user,
				ADD COLUMN IF NOT EXISTS cancelled_by      text NOT NULL DEFAULT '',
				ADD COLUMN IF NOT EXISTS cancelled_os_user text NOT NULL DEFAULT '',
				ADD COLUMN IF NOT EXISTS cancelled_db_user text NOT NULL DEFAULT '';
		END IF;
	END $$`,
	// One operation per projection in flight: a second start fails on
	// this index, whichever replica or client sends it.
	`CREATE UNIQUE INDEX IF NOT EXISTS projector_rebuilds_in_flight
		ON projector_rebuilds (identity, projection) WHERE state IN ('accepted', 'running', 'cutting_over')`,
	// Writes through a projection's view are refused: the view names the
	// live generation's table, which only that generation's engine
	// writes. An engine of a generation that is no longer live meets
	// this (SQLSTATE PJ001) rather than writing the new one's rows.
	`CREATE OR REPLACE FUNCTION projector_generation_view_write() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		RAISE EXCEPTION USING ERRCODE = 'PJ001',
			MESSAGE = format('%I is the view of a projection''s live generation: projector writes the generation''s table, nothing writes the view', TG_TABLE_NAME);
	END $$`,
}

// migrationLock serialises replicas creating these tables together.
const migrationLock = 0x70726f67 // "prog"

// Migrate creates the tables of generations and rebuild operations when
// missing.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock); err != nil {
			return fmt.Errorf("migrate generations: lock: %w", err)
		}
		for _, stmt := range ddl {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("migrate generations: %w", err)
			}
		}
		return nil
	})
}
