package postgres

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/projection"
)

// migrationLock serialises schema changes of replicas starting together.
const migrationLock = 0x70726f6a // "proj"

// engineDDL creates the engine's own tables but the dead letters' (see
// deadletters.Schema). Every statement is idempotent.
var engineDDL = []string{
	`CREATE TABLE IF NOT EXISTS projector_offsets (
		identity    text        NOT NULL,
		topic       text        NOT NULL,
		partition   integer     NOT NULL,
		next_offset bigint,
		owner_epoch bigint      NOT NULL DEFAULT 0,
		updated_at  timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (identity, topic, partition)
	)`,
	// When the engine last saw the partition caught up: a commit that
	// reached the high watermark its member knew, or the mark an idle
	// member leaves. Readers tell a partition's staleness by it. Added
	// only when missing: ALTER TABLE locks the table even when the
	// column exists.
	`DO $$ BEGIN
		IF NOT EXISTS (SELECT 1 FROM pg_attribute
			WHERE attrelid = to_regclass('projector_offsets') AND attname = 'caught_up_at' AND NOT attisdropped) THEN
			ALTER TABLE projector_offsets ADD COLUMN caught_up_at timestamptz;
		END IF;
	END $$`,
	// What the member assigned a partition says of it when something
	// keeps it from moving (backing off, stalled, halted, orphaned), for
	// projector status: written when the state changes, never per batch,
	// and kept apart from projector_offsets so that it never waits on a
	// commit's row lock.
	`CREATE TABLE IF NOT EXISTS projector_partition_states (
		identity   text        NOT NULL,
		topic      text        NOT NULL,
		partition  integer     NOT NULL,
		state      text        NOT NULL,
		halt       text        NOT NULL DEFAULT '',
		reason     text        NOT NULL,
		member     text        NOT NULL,
		since      timestamptz NOT NULL,
		updated_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (identity, topic, partition)
	)`,
	// What halted a halted partition, for a table created before it was
	// kept. Added only when missing: ALTER TABLE locks the table even
	// when the column exists.
	`DO $$ BEGIN
		IF NOT EXISTS (SELECT 1 FROM pg_attribute
			WHERE attrelid = to_regclass('projector_partition_states') AND attname = 'halt' AND NOT attisdropped) THEN
			ALTER TABLE projector_partition_states ADD COLUMN halt text NOT NULL DEFAULT '';
		END IF;
	END $$`,
	// Every operator reset of a stored offset: who, when, from where to
	// where, and the owner epoch that fenced the owner of the time.
	`CREATE TABLE IF NOT EXISTS projector_offsets_audit (
		id          bigserial   PRIMARY KEY,
		at          timestamptz NOT NULL DEFAULT now(),
		actor       text        NOT NULL,
		identity    text        NOT NULL,
		topic       text        NOT NULL,
		partition   integer     NOT NULL,
		old_offset  bigint,
		new_offset  bigint      NOT NULL,
		owner_epoch bigint      NOT NULL,
		detail      text        NOT NULL DEFAULT ''
	)`,
	// Who reset beside the actor given: the operating-system user of the
	// command and the database session user of its transaction. Added
	// only when missing: ALTER TABLE locks the table even with nothing to
	// do.
	`DO $$ BEGIN
		IF (SELECT count(*) FROM pg_attribute WHERE attrelid = 'projector_offsets_audit'::regclass AND NOT attisdropped
		    AND attname IN ('os_user', 'db_user')) < 2 THEN
			ALTER TABLE projector_offsets_audit
				ADD COLUMN IF NOT EXISTS os_user text NOT NULL DEFAULT '',
				ADD COLUMN IF NOT EXISTS db_user text NOT NULL DEFAULT session_user;
		END IF;
	END $$`,
	`CREATE TABLE IF NOT EXISTS projector_tombstones (
		table_name text        NOT NULL,
		key        text        NOT NULL,
		version    bigint      NOT NULL,
		deleted_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (table_name, key)
	)`,
	// The tombstones past their retention, oldest first, for the
	// engine's background pruning (see PruneTombstones), which would
	// otherwise read the whole table to find them. Created only when
	// missing: CREATE INDEX locks the table against writes even when the
	// index exists, and a replica starting would queue every member's
	// deletes behind a frozen member's open transaction. Created once
	// on a table of many tombstones, it holds their writes for as long
	// as it takes to build.
	`DO $$ BEGIN
		IF to_regclass('projector_tombstones_deleted_at') IS NULL THEN
			CREATE INDEX IF NOT EXISTS projector_tombstones_deleted_at ON projector_tombstones (table_name, deleted_at);
		END IF;
	END $$`,
	`CREATE TABLE IF NOT EXISTS projector_parked (
		identity   text        NOT NULL,
		projection text        NOT NULL,
		topic      text        NOT NULL,
		partition  integer     NOT NULL,
		key        text        NOT NULL,
		version    bigint      NOT NULL,
		"offset"   bigint      NOT NULL,
		record_key bytea,
		value      bytea,
		headers    jsonb       NOT NULL DEFAULT '[]',
		record_time timestamptz,
		parked_at  timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (identity, topic, partition, key, projection, version)
	)`,
	// Each projection of a topic parks its own events: one aggregate's
	// version may wait in two of them. The key of earlier releases lacked
	// the projection; theirs still find their rows through the new key's
	// leading columns, and insert with ON CONFLICT DO NOTHING, which any
	// key satisfies.
	`DO $$ DECLARE pk text; n int; BEGIN
		SELECT conname, array_length(conkey, 1) INTO pk, n FROM pg_constraint
		WHERE conrelid = 'projector_parked'::regclass AND contype = 'p';
		IF n = 5 THEN
			EXECUTE format('ALTER TABLE projector_parked DROP CONSTRAINT %I, ADD PRIMARY KEY (identity, topic, partition, key, projection, version)', pk);
		END IF;
	END $$`,
}

// ErrTableMismatch reports a projection whose table exists with other
// columns or types than the projection declares.
var ErrTableMismatch = errors.New("existing table does not match the projection")

// ErrUnfilledColumn reports an existing table with a column the projection
// does not write that is NOT NULL without a default: every insert would
// fail (SQLSTATE 23502) and every event be dead-lettered. Errors wrapping
// it wrap ErrTableMismatch too.
var ErrUnfilledColumn = errors.New("a column the projection does not fill is NOT NULL without a default")

// Migrate creates the engine's tables and every projection's table when
// missing, and refuses a projection that contradicts an existing table.
// Before it creates anything it proves the projections against Postgres:
// each column type must resolve to a type (ErrBadType), each default must
// cast to its column's type (ErrBadDefault), and no two projections may
// write one table (ErrTableShared). Each column then holds the name
// Postgres gives its type (see projection.Projection.SetTypes), so call it
// before building sinks.
func Migrate(ctx context.Context, pool *pgxpool.Pool, projections ...*projection.Projection) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock); err != nil {
			return fmt.Errorf("migrate: lock: %w", err)
		}
		if err := resolve(ctx, tx, projections); err != nil {
			return err
		}
		for _, stmt := range slices.Concat(engineDDL, deadletters.Schema()) {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("migrate: %w", err)
			}
		}
		if sharesTopic(projections) {
			if _, err := tx.Exec(ctx, deadletters.SharedTopics()); err != nil {
				return fmt.Errorf("migrate: dead letters of projections sharing a topic: %w", err)
			}
		}
		for _, p := range projections {
			if err := ensureTable(ctx, tx, p); err != nil {
				return err
			}
		}
		return nil
	})
}

// sharesTopic reports whether two of ps read one topic.
func sharesTopic(ps []*projection.Projection) bool {
	seen := map[string]bool{}
	for _, p := range ps {
		if seen[p.Topic] {
			return true
		}
		seen[p.Topic] = true
	}
	return false
}

func ensureTable(ctx context.Context, tx pgx.Tx, p *projection.Projection) error {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, p.Table).Scan(&exists); err != nil {
		return fmt.Errorf("projection %q: look up table %s: %w", p.Name, p.Table, err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, createTableSQL(p)); err != nil {
			return fmt.Errorf("projection %q: create table %s: %w", p.Name, p.Table, err)
		}
		return ensureReadIndexes(ctx, tx, p)
	}
	if err := checkTable(ctx, tx, p); err != nil {
		return err
	}
	if err := setFillfactor(ctx, tx, p); err != nil {
		return err
	}
	return ensureReadIndexes(ctx, tx, p)
}

// ensureReadIndexes creates the indexes the read API's queries use, on
// each filterable column and on the tenant column, those of the key
// column first so that a page of a filtered list is read in key order.
// Each is created only when no index of the table already begins with
// its columns: CREATE INDEX locks the table against writes even when the
// index exists, and a replica starting would queue every member's writes
// behind a frozen member's open transaction. Created once on a large
// table, it holds the table's writes for as long as it takes to build;
// create it beforehand with CREATE INDEX CONCURRENTLY to avoid that.
func ensureReadIndexes(ctx context.Context, tx pgx.Tx, p *projection.Projection) error {
	var want [][]string
	for _, c := range p.Filterable {
		if c == p.KeyColumn {
			continue // the primary key
		}
		if p.Tenant != "" && c != p.Tenant {
			want = append(want, []string{p.Tenant, c, p.KeyColumn})
		} else {
			want = append(want, []string{c, p.KeyColumn})
		}
	}
	if p.Tenant != "" && p.Tenant != p.KeyColumn {
		want = append(want, []string{p.Tenant, p.KeyColumn})
	}
	for _, cols := range want {
		var have bool
		err := tx.QueryRow(ctx, `SELECT EXISTS (
			SELECT FROM pg_index i
			WHERE i.indrelid = $1::regclass AND i.indnkeyatts >= cardinality($2::text[])
			  AND (SELECT array_agg(a.attname::text ORDER BY k.n)
			       FROM unnest((i.indkey::int2[])[0:cardinality($2::text[])-1]) WITH ORDINALITY k(attnum, n)
			       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum) = $2::text[])`,
			p.Table, cols).Scan(&have)
		if err != nil {
			return fmt.Errorf("projection %q: look up the indexes of table %s: %w", p.Name, p.Table, err)
		}
		if have {
			continue
		}
		quoted := make([]string, len(cols))
		for i, c := range cols {
			quoted[i] = quoteIdent(c)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE INDEX ON %s (%s)", quoteTable(p.Table), strings.Join(quoted, ", "))); err != nil {
			return fmt.Errorf("projection %q: create the index on %s of table %s: %w", p.Name, strings.Join(cols, ", "), p.Table, err)
		}
	}
	return nil
}

// setFillfactor gives an existing table the fillfactor its projection sets
// explicitly (one that leaves it to the default keeps the table's own).
// Postgres applies it to the pages written from then on; the lock it takes
// blocks neither reads nor writes.
func setFillfactor(ctx context.Context, tx pgx.Tx, p *projection.Projection) error {
	if p.Fillfactor == 0 {
		return nil
	}
	var have int
	if err := tx.QueryRow(ctx, `SELECT coalesce((SELECT option_value::int FROM pg_options_to_table(reloptions)
		WHERE option_name = 'fillfactor'), 100) FROM pg_class WHERE oid = $1::regclass`, p.Table).Scan(&have); err != nil {
		return fmt.Errorf("projection %q: read the fillfactor of table %s: %w", p.Name, p.Table, err)
	}
	if have == p.Fillfactor {
		return nil
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER TABLE %s SET (fillfactor = %d)", quoteTable(p.Table), p.Fillfactor)); err != nil {
		return fmt.Errorf("projection %q: set the fillfactor of table %s to %d: %w", p.Name, p.Table, p.Fillfactor, err)
	}
	return nil
}

func createTableSQL(p *projection.Projection) string {
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE TABLE %s (\n", quoteTable(p.Table))
	for i, c := range p.Columns {
		fmt.Fprintf(&b, "\t%s %s", quoteIdent(c.Name), c.Type)
		if i == 0 {
			if byteOrderable(c.Type) {
				b.WriteString(` COLLATE "C"`)
			}
			b.WriteString(" PRIMARY KEY")
		}
		b.WriteString(",\n")
	}
	// Room on each page for updated row versions: upserts can then stay
	// heap-only (no index update) and write less WAL.
	fmt.Fprintf(&b, "\tversion bigint NOT NULL\n) WITH (fillfactor = %d)", p.TableFillfactor())
	return b.String()
}

// keyTypeRe matches the string types whose primary key the engine creates
// in byte order.
var keyTypeRe = regexp.MustCompile(`^(?i)(text|varchar|character varying)\s*(\(\s*\d+\s*\))?$`)

// byteOrderable reports whether a key column of type typ is created with
// the "C" collation. Keys are identifiers: equality is the same under every
// deterministic collation, and comparing bytes is what every probe of the
// key's index does once per tree level. Under the database's default
// collation (a libc locale) each comparison calls strcoll, which makes
// the engine's updates and inserts cost Postgres more CPU, and an
// operating-system upgrade that changes the locale's order can leave the
// index corrupt, which byte order never does.
func byteOrderable(typ string) bool { return keyTypeRe.MatchString(strings.TrimSpace(typ)) }

// checkTable compares an existing table with the projection: every
// declared column must exist with the same type (type modifiers aside), the
// key column must be the primary key, and a bigint version column must
// exist. Extra columns are allowed, but for one that is NOT NULL without a
// default (ErrUnfilledColumn), which no insert of the engine would fill.
func checkTable(ctx context.Context, tx pgx.Tx, p *projection.Projection) error {
	problems, err := tableProblems(ctx, tx, p)
	if err != nil {
		return err
	}
	var mismatches, unfilled []string
	for _, pr := range problems {
		if pr.unfilled {
			unfilled = append(unfilled, pr.text)
		} else {
			mismatches = append(mismatches, pr.text)
		}
	}
	switch {
	case len(unfilled) > 0 && len(mismatches) > 0:
		return fmt.Errorf("projection %q: table %s: %w: %s; %w: %s", p.Name, p.Table, ErrTableMismatch, strings.Join(mismatches, "; "),
			ErrUnfilledColumn, strings.Join(unfilled, "; "))
	case len(unfilled) > 0:
		return fmt.Errorf("projection %q: table %s: %w: %w: %s", p.Name, p.Table, ErrTableMismatch, ErrUnfilledColumn, strings.Join(unfilled, "; "))
	case len(mismatches) > 0:
		return fmt.Errorf("projection %q: table %s: %w: %s", p.Name, p.Table, ErrTableMismatch, strings.Join(mismatches, "; "))
	}
	return nil
}

// tableProblem is one way an existing table differs from its projection.
type tableProblem struct {
	text     string
	unfilled bool // an ErrUnfilledColumn, else an ErrTableMismatch
}

// err is the problem as Check reports it.
func (pr tableProblem) err(p *projection.Projection) error {
	if pr.unfilled {
		return fmt.Errorf("projection %q: table %s: %w: %w: %s", p.Name, p.Table, ErrTableMismatch, ErrUnfilledColumn, pr.text)
	}
	return fmt.Errorf("projection %q: table %s: %w: %s", p.Name, p.Table, ErrTableMismatch, pr.text)
}

// tableProblems lists how an existing table differs from the projection
// (see checkTable), one problem a line.
func tableProblems(ctx context.Context, tx pgx.Tx, p *projection.Projection) ([]tableProblem, error) {
	// unfilled: NOT NULL (of the column or of its domain) with no default
	// (of the column or of its domain), neither identity nor generated:
	// an insert that leaves it out fails.
	rows, err := tx.Query(ctx, `
		SELECT a.attname, format_type(a.atttypid, NULL),
		       coalesce((SELECT i.indnatts = 1 AND i.indkey[0] = a.attnum
		                 FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisprimary), false),
		       (a.attnotnull OR t.typnotnull) AND NOT a.atthasdef AND t.typdefault IS NULL
		           AND t.typdefaultbin IS NULL AND a.attidentity = '' AND a.attgenerated = ''
		FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
		WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, p.Table)
	if err != nil {
		return nil, fmt.Errorf("projection %q: inspect table %s: %w", p.Name, p.Table, err)
	}
	type col struct {
		typ      string
		pk       bool
		unfilled bool
	}
	have := map[string]col{}
	var order []string
	for rows.Next() {
		var name, typ string
		var pk, unfilled bool
		if err := rows.Scan(&name, &typ, &pk, &unfilled); err != nil {
			return nil, fmt.Errorf("projection %q: inspect table %s: %w", p.Name, p.Table, err)
		}
		have[name] = col{typ, pk, unfilled}
		order = append(order, name)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("projection %q: inspect table %s: %w", p.Name, p.Table, err)
	}
	var problems []tableProblem
	mismatch := func(format string, args ...any) {
		problems = append(problems, tableProblem{text: fmt.Sprintf(format, args...)})
	}
	declared := map[string]bool{"version": true}
	for i, c := range p.Columns {
		declared[c.Name] = true
		var want string
		if err := tx.QueryRow(ctx, `SELECT format_type(to_regtype($1), NULL)`, c.Type).Scan(&want); err != nil || want == "" {
			mismatch("column %s: %q is not a known Postgres type", c.Name, c.Type)
			continue
		}
		h, ok := have[c.Name]
		switch {
		case !ok:
			mismatch("column %s (%s) is missing", c.Name, want)
		case h.typ != want:
			mismatch("column %s is %s in the table but %s in the projection", c.Name, h.typ, want)
		case i == 0 && !h.pk:
			mismatch("column %s is not the table's single-column primary key", c.Name)
		}
	}
	if v, ok := have["version"]; !ok || v.typ != "bigint" {
		mismatch("column version bigint is missing")
	}
	for _, name := range order {
		if h := have[name]; h.unfilled && !declared[name] {
			problems = append(problems, tableProblem{unfilled: true, text: fmt.Sprintf(
				"column %s (%s): every insert would fail with SQLSTATE 23502 (not_null_violation) and every event be dead-lettered; "+
					"fix: give it a default (ALTER TABLE %s ALTER COLUMN %s SET DEFAULT …), drop its NOT NULL (ALTER TABLE %[3]s ALTER COLUMN %[4]s DROP NOT NULL), "+
					"or declare it among the projection's columns with a default or a field that fills it",
				name, h.typ, quoteTable(p.Table), quoteIdent(name))})
		}
	}
	return problems, nil
}

func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }
