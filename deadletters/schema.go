package deadletters

// Schema returns the statements that create the dead letters' tables
// (the dead letters, their audit log, their redrive queue and their
// publish outbox) when
// missing. Every statement is idempotent; the Postgres sink's Migrate runs
// them with the engine's other tables.
func Schema() []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS projector_dead_letters (
		id          bigserial   PRIMARY KEY,
		identity    text        NOT NULL,
		projection  text        NOT NULL,
		topic       text        NOT NULL,
		partition   integer     NOT NULL,
		"offset"    bigint      NOT NULL,
		record_key  bytea,
		value       bytea,
		headers     jsonb       NOT NULL DEFAULT '[]',
		record_time timestamptz,
		error       text        NOT NULL,
		attempts    integer     NOT NULL DEFAULT 1,
		first_seen  timestamptz NOT NULL DEFAULT now(),
		last_seen   timestamptz NOT NULL DEFAULT now(),
		UNIQUE (identity, topic, partition, "offset")
	)`,
		// Dead-letter lifecycle: what kind of failure, where the record came
		// from, and whether an operator replayed or resolved it.
		//
		// This and the index below run only when missing: ALTER TABLE and
		// CREATE INDEX lock the table even when there is nothing to do, and a
		// replica starting while a transaction holds the table open (a frozen
		// member's) would wait, with every member's writes queued behind it.
		`DO $$ BEGIN
		IF (SELECT count(*) FROM pg_attribute WHERE attrelid = 'projector_dead_letters'::regclass AND NOT attisdropped
		    AND attname IN ('error_class', 'schema_id', 'trace_id', 'status', 'replays', 'replayed_at', 'resolved_at')) < 7 THEN
			ALTER TABLE projector_dead_letters
				ADD COLUMN IF NOT EXISTS error_class text NOT NULL DEFAULT 'decode',
				ADD COLUMN IF NOT EXISTS schema_id   integer,
				ADD COLUMN IF NOT EXISTS trace_id    text,
				ADD COLUMN IF NOT EXISTS status      text NOT NULL DEFAULT 'open',
				ADD COLUMN IF NOT EXISTS replays     integer NOT NULL DEFAULT 0,
				ADD COLUMN IF NOT EXISTS replayed_at timestamptz,
				ADD COLUMN IF NOT EXISTS resolved_at timestamptz;
		END IF;
	END $$`,
		`DO $$ BEGIN
		IF to_regclass('projector_dead_letters_open') IS NULL THEN
			CREATE INDEX IF NOT EXISTS projector_dead_letters_open
				ON projector_dead_letters (projection, first_seen) WHERE status = 'open';
		END IF;
	END $$`,
		// A record may be dead-lettered once for each projection of its
		// topic: entries are unique per projection. The older constraint,
		// without the projection, stays until projections share a topic
		// (see SharedTopics), so that replicas of an earlier release,
		// whose writes name it, keep working through a rolling deploy.
		`DO $$ BEGIN
		IF to_regclass('projector_dead_letters_projection_offset') IS NULL THEN
			CREATE UNIQUE INDEX IF NOT EXISTS projector_dead_letters_projection_offset
				ON projector_dead_letters (identity, topic, partition, "offset", projection);
		END IF;
	END $$`,
		// Every replay and purge, who did it and what it touched.
		`CREATE TABLE IF NOT EXISTS projector_dlq_audit (
		id        bigserial   PRIMARY KEY,
		at        timestamptz NOT NULL DEFAULT now(),
		actor     text        NOT NULL,
		action    text        NOT NULL,
		filter    jsonb       NOT NULL DEFAULT '{}',
		entry_ids bigint[]    NOT NULL DEFAULT '{}',
		detail    text        NOT NULL DEFAULT ''
	)`,
		// Who did it beyond the --actor an operator may give: the
		// operating-system user that ran the command and the database
		// session user of the transaction (see Actor). Added only when
		// missing, for the reason given above.
		`DO $$ BEGIN
		IF (SELECT count(*) FROM pg_attribute WHERE attrelid = 'projector_dlq_audit'::regclass AND NOT attisdropped
		    AND attname IN ('os_user', 'db_user')) < 2 THEN
			ALTER TABLE projector_dlq_audit
				ADD COLUMN IF NOT EXISTS os_user text NOT NULL DEFAULT '',
				ADD COLUMN IF NOT EXISTS db_user text NOT NULL DEFAULT session_user;
		END IF;
	END $$`,
		// Dead letters queued for the worker that owns their partition to
		// apply again (see Redrive): one row per dead letter at most.
		`CREATE TABLE IF NOT EXISTS projector_redrives (
		id             bigserial   PRIMARY KEY,
		identity       text        NOT NULL,
		projection     text        NOT NULL,
		topic          text        NOT NULL,
		partition      integer     NOT NULL,
		dead_letter_id bigint      NOT NULL UNIQUE REFERENCES projector_dead_letters (id) ON DELETE CASCADE,
		requested_at   timestamptz NOT NULL DEFAULT now(),
		requested_by   text        NOT NULL,
		os_user        text        NOT NULL DEFAULT '',
		db_user        text        NOT NULL DEFAULT session_user,
		state          text        NOT NULL DEFAULT 'queued'
	)`,
		`DO $$ BEGIN
		IF to_regclass('projector_redrives_partition') IS NULL THEN
			CREATE INDEX IF NOT EXISTS projector_redrives_partition
				ON projector_redrives (identity, topic, partition, id);
		END IF;
	END $$`,
		// Dead letters waiting to be published to the dead-letter topic,
		// written in the same transaction as the dead letter itself.
		`CREATE TABLE IF NOT EXISTS projector_dlq_outbox (
		dead_letter_id bigint      PRIMARY KEY REFERENCES projector_dead_letters (id) ON DELETE CASCADE,
		topic          text        NOT NULL,
		created_at     timestamptz NOT NULL DEFAULT now()
	)`,
	}
}

// SharedTopics returns the statement that lets one record be
// dead-lettered for several projections: it drops the uniqueness of a
// dead letter per identity and offset alone, which earlier releases
// wrote with. Run it once projections share a topic (replicas of an
// earlier release then fail their dead-letter writes, and retry them
// until they are replaced).
func SharedTopics() string {
	return `DO $$ DECLARE c text; BEGIN
		SELECT conname INTO c FROM pg_constraint
		WHERE conrelid = 'projector_dead_letters'::regclass AND contype = 'u' AND array_length(conkey, 1) = 4;
		IF c IS NOT NULL THEN
			EXECUTE format('ALTER TABLE projector_dead_letters DROP CONSTRAINT %I', c);
		END IF;
	END $$`
}
