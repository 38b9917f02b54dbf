package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
)

// Sink writes one projection's rows and the partition offsets of one
// consumer identity.
type Sink struct {
	pool     *pgxpool.Pool
	identity string
	p        *projection.Projection

	dlqTopic string
	cache    *stateCache

	loadSQL   string
	upsertSQL string
	updateSQL string
	deleteSQL string
}

var _ partition.Sink = (*Sink)(nil)

// NewSink prepares the statements of projection p for identity. Call
// Migrate first. With dlqTopic set, every new dead letter is also queued
// (in the same transaction) for publishing to that Kafka topic.
func NewSink(pool *pgxpool.Pool, identity string, p *projection.Projection, dlqTopic string) *Sink {
	s := &Sink{pool: pool, identity: identity, p: p, dlqTopic: dlqTopic, cache: newStateCache(DefaultStateCacheRows, p.Columns)}
	s.loadSQL, s.upsertSQL, s.updateSQL, s.deleteSQL = rowSQL(p)
	return s
}

// SetStateCache sets how many aggregates' rows the sink keeps in memory
// (across its partitions) so that a batch reads only the others from
// Postgres; 0 turns the cache off. Call it before the first batch.
func (s *Sink) SetStateCache(rows int) { s.cache = newStateCache(rows, s.p.Columns) }

// Forget drops what the sink keeps in memory about a partition; call it
// when the partition is revoked.
func (s *Sink) Forget(tp partition.TP) { s.cache.drop(tp) }

// errStaleState reports a batch planned on state (cached, or read earlier
// in the transaction) that Postgres contradicts when the rows are written;
// the transaction is rolled back and retried from Postgres.
var errStaleState = errors.New("an aggregate's row in Postgres is not what the batch was planned on (was the table written by something else?); retrying from Postgres")

// rowSQL builds the set-based statements of a projection's table. Values
// travel as arrays (see newColumn), binary for integers, floats, booleans
// and timestamps and text for every other type, and are cast to the column
// types in SQL.
func rowSQL(p *projection.Projection) (load, upsert, update, del string) {
	table := quoteTable(p.Table)
	key := p.Columns[0]
	keyCol := quoteIdent(key.Name)

	var sel, names, values, params, unnested, sets, updSets []string
	for i, c := range p.Columns {
		q := quoteIdent(c.Name)
		sel = append(sel, "t."+q+"::text")
		names = append(names, q)
		col := newColumn(c, i == 0, 0)
		var refs []string
		for j, typ := range col.sqlTypes() {
			name := fmt.Sprintf("c%d", i)
			if j > 0 {
				name = fmt.Sprintf("c%d_%d", i, j)
			}
			params = append(params, fmt.Sprintf("$%d::%s", len(params)+1, typ))
			unnested = append(unnested, name)
			refs = append(refs, "u."+name)
		}
		values = append(values, col.expr(refs))
		if i > 0 {
			sets = append(sets, fmt.Sprintf("%s = excluded.%s", q, q))
			updSets = append(updSets, fmt.Sprintf("%s = %s", q, values[i]))
		}
	}
	versions := len(params) + 1
	sets = append(sets, "version = excluded.version")

	// Rows and tombstones are looked up by separate index probes: a join
	// of both kept in a cached plan degrades with the tombstone count. The
	// LATERAL ... LIMIT 1 keeps every lookup an index probe: as a plain
	// join the planner hashes the whole table once it has grown (a batch
	// of 1,000 keys against 100,000 rows took ten times as long).
	load = fmt.Sprintf(`SELECT k.key, t.version, %s
		FROM unnest($1::text[]) AS k(key)
		CROSS JOIN LATERAL (SELECT * FROM %s t WHERE t.%s = k.key::%s LIMIT 1) t`,
		strings.Join(sel, ", "), table, keyCol, key.Type)
	upsert = fmt.Sprintf(`INSERT INTO %s (%s, version)
		SELECT %s, u.version FROM unnest(%s, $%d::bigint[]) AS u(%s, version)
		ON CONFLICT (%s) DO UPDATE SET %s WHERE %s.version < excluded.version`,
		table, strings.Join(names, ", "),
		strings.Join(values, ", "), strings.Join(params, ", "), versions, strings.Join(unnested, ", "),
		keyCol, strings.Join(sets, ", "), table)
	// Rows known to exist are updated in place: an upsert that meets its
	// conflict also locks the row, one more WAL record per row. The join
	// runs as index probes (see planIndexProbes).
	updSets = append(updSets, "version = u.version")
	update = fmt.Sprintf(`UPDATE %s AS t SET %s
		FROM unnest(%s, $%d::bigint[]) AS u(%s, version)
		WHERE t.%s = u.c0::%s AND t.version < u.version`,
		table, strings.Join(updSets, ", "), strings.Join(params, ", "), versions, strings.Join(unnested, ", "),
		keyCol, key.Type)
	del = fmt.Sprintf(`DELETE FROM %s WHERE %s = ANY($1::text[]::%s[])`, table, keyCol, key.Type)
	return load, upsert, update, del
}

const (
	tombstoneLoadSQL = `SELECT k.key, t.version FROM unnest($2::text[]) AS k(key)
		CROSS JOIN LATERAL (SELECT version FROM projector_tombstones t
		                    WHERE t.table_name = $1 AND t.key = k.key LIMIT 1) t`
	// planIndexProbes keeps the joins of the rest of the transaction (the
	// update of existing rows by key) nested loops over index probes: with
	// a batch's keys the planner may otherwise hash a large table.
	planIndexProbes = `SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)`
	parkedLoadSQL   = `SELECT key, version, "offset", record_key, value, headers, record_time
		FROM projector_parked
		WHERE identity = $1 AND topic = $2 AND partition = $3 AND key = ANY($4::text[])`
	parkedKeysSQL = `SELECT DISTINCT key FROM projector_parked
		WHERE identity = $1 AND topic = $2 AND partition = $3`
	parkSQL = `INSERT INTO projector_parked
		(identity, projection, topic, partition, key, version, "offset", record_key, value, headers, record_time)
		SELECT $1, $2, $3, $4, u.key, u.version, u.off, u.rkey, u.value, u.headers, u.ts
		FROM unnest($5::text[], $6::bigint[], $7::bigint[], $8::bytea[], $9::bytea[], $10::jsonb[], $11::timestamptz[])
		  AS u(key, version, off, rkey, value, headers, ts)
		ON CONFLICT DO NOTHING`
	unparkSQL = `DELETE FROM projector_parked p
		USING unnest($4::text[], $5::bigint[]) AS u(key, version)
		WHERE p.identity = $1 AND p.topic = $2 AND p.partition = $3 AND p.key = u.key AND p.version = u.version`
	tombstoneSQL = `INSERT INTO projector_tombstones (table_name, key, version)
		SELECT $1, u.key, u.version FROM unnest($2::text[], $3::bigint[]) AS u(key, version)
		ON CONFLICT (table_name, key) DO UPDATE SET version = excluded.version, deleted_at = now()
		WHERE projector_tombstones.version < excluded.version`
	// deadLetterSQL stores dead letters. A replayed record that failed
	// again ($15 names the entry it replays) reopens that entry of this
	// identity with one more attempt instead of adding one; otherwise, and
	// when that entry is gone, a new entry is added. With a dead-letter
	// topic configured ($16 not empty) new entries are queued for
	// publishing in the same transaction.
	deadLetterSQL = `WITH u AS (
		SELECT * FROM unnest($5::bigint[], $6::bytea[], $7::bytea[], $8::jsonb[], $9::timestamptz[], $10::text[],
		                     $11::text[], $12::int[], $13::int[], $14::text[], $15::bigint[])
		  AS u(off, rkey, value, headers, ts, err, class, attempts, schema_id, trace_id, replay_of)
	), reopened AS (
		UPDATE projector_dead_letters d
		SET attempts = d.attempts + 1, last_seen = now(), error = u.err, error_class = u.class, status = 'open'
		FROM u WHERE d.id = u.replay_of AND d.identity = $1 AND d.status <> 'purged'
		RETURNING u.off
	), dl AS (
		INSERT INTO projector_dead_letters AS d
		(identity, projection, topic, partition, "offset", record_key, value, headers, record_time, error,
		 error_class, attempts, schema_id, trace_id)
		SELECT $1, $2, $3, $4, u.off, u.rkey, u.value, u.headers, u.ts, u.err, u.class, u.attempts, u.schema_id, u.trace_id
		FROM u WHERE u.off NOT IN (SELECT off FROM reopened)
		ON CONFLICT (identity, topic, partition, "offset")
		DO UPDATE SET last_seen = now(), attempts = d.attempts + 1, error = excluded.error, error_class = excluded.error_class
		RETURNING d.id)
	INSERT INTO projector_dlq_outbox (dead_letter_id, topic)
	SELECT id, $16 FROM dl WHERE $16 <> ''
	ON CONFLICT (dead_letter_id) DO NOTHING`
	resolvedSQL = `UPDATE projector_dead_letters SET status = 'resolved', resolved_at = now()
		WHERE id = ANY($1::bigint[]) AND identity = $2 AND status NOT IN ('resolved', 'purged')`
	advanceSQL = `UPDATE projector_offsets SET next_offset = $1, updated_at = now()
		WHERE identity = $2 AND topic = $3 AND partition = $4 AND owner_epoch = $5 AND next_offset = $6`
)

// CommitBatch implements partition.Sink. When Postgres refuses a row (a
// data error, SQLSTATE classes 22, 23 and 54), the batch is run again with
// each row under its own savepoint to find the refused ones, which are
// returned as *partition.RejectedRows.
func (s *Sink) CommitBatch(ctx context.Context, claim partition.Claim, end int64, keys, parkedKeys []string, plan func(partition.State) (partition.Changes, error)) error {
	err := s.commit(ctx, claim, end, keys, parkedKeys, plan, false)
	if rowLevel(err) {
		err = s.commit(ctx, claim, end, keys, parkedKeys, plan, true)
	}
	if err != nil {
		s.cache.drop(claim.TP)
	}
	return err
}

// rowLevel reports errors caused by the data of some row rather than by
// the database being unavailable.
func rowLevel(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || len(pg.Code) < 2 {
		return false
	}
	switch pg.Code[:2] {
	case "22", "23", "54":
		return true
	}
	return false
}

func (s *Sink) commit(ctx context.Context, claim partition.Claim, end int64, keys, parkedKeys []string, plan func(partition.State) (partition.Changes, error), isolate bool) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after commit

	state := partition.State{
		Rows:     make(map[string]projection.Row, len(keys)),
		Versions: make(map[string]int64, len(keys)),
	}
	misses, hits, caching := s.cache.lookup(claim, keys, state)
	if err := s.load(ctx, tx, claim.TP, misses, parkedKeys, &state); err != nil {
		return err
	}
	ch, err := plan(state)
	if err != nil {
		return err
	}
	// Rows the state says exist are updated, the others upserted; upserts
	// lists them in that order.
	var existing int
	ch.Upserts, existing = existingFirst(ch.Upserts, state.Rows)
	upserts, inexact := ch.Upserts, []int{} // inexact: rows storedRows must convert
	if isolate {
		if err := s.isolateUpserts(ctx, tx, ch.Upserts); err != nil {
			return err
		}
		ch.Upserts, existing = nil, 0 // written one by one above
	}
	b := &pgx.Batch{}
	written, err := s.queueChanges(b, claim.TP, ch, existing, &inexact)
	if err != nil {
		return err
	}
	if isolate {
		inexact = nil // not known: check every row
	}
	advance := b.Queue(advanceSQL, end, s.identity, claim.Topic, claim.Partition, claim.Epoch, claim.NextOffset)
	var fenced bool
	advance.Exec(func(tag pgconn.CommandTag) error {
		fenced = tag.RowsAffected() == 0
		return nil
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("write batch: %w", err)
	}
	if fenced {
		return partition.ErrFenced
	}
	// A row the plan expected to write but Postgres kept (it holds that
	// version or a newer one, or no longer exists for the update) means
	// the state came from a stale cache or the table was written behind
	// projector's back: retry from Postgres.
	if (hits > 0 || existing > 0) && *written < int64(len(ch.Upserts)) {
		return errStaleState
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if caching {
		stored, err := s.storedRows(upserts, inexact)
		if err != nil {
			s.cache.drop(claim.TP) // committed; the next batch reads from Postgres
			return nil
		}
		s.cache.store(claim, misses, state, stored, ch.Deletes)
	}
	return nil
}

// existingFirst returns upserts reordered with the rows that exist (those
// in rows) first, and how many those are.
func existingFirst(upserts []partition.RowWrite, rows map[string]projection.Row) ([]partition.RowWrite, int) {
	out := make([]partition.RowWrite, 0, len(upserts))
	for _, w := range upserts {
		if _, ok := rows[w.Key]; ok {
			out = append(out, w)
		}
	}
	n := len(out)
	for _, w := range upserts {
		if _, ok := rows[w.Key]; !ok {
			out = append(out, w)
		}
	}
	return out, n
}

// storedRows returns rows as a load from Postgres would return them (see
// projection.Column.Stored), reusing those already in that form. With only
// not nil, the other rows are known to be in that form already.
func (s *Sink) storedRows(rows []partition.RowWrite, only []int) ([]partition.RowWrite, error) {
	out, copied := rows, false
	check := func(yield func(int, partition.RowWrite) bool) {
		if only == nil {
			for i, w := range rows {
				if !yield(i, w) {
					return
				}
			}
			return
		}
		for _, i := range only {
			if !yield(i, rows[i]) {
				return
			}
		}
	}
	for i, w := range check {
		var conv projection.Row
		for _, c := range s.p.Columns {
			v := w.Row[c.Name]
			st, err := c.Stored(v)
			if err != nil {
				return nil, err
			}
			if conv == nil && !sameStored(st, v) {
				conv = make(projection.Row, len(s.p.Columns))
				for _, c2 := range s.p.Columns {
					conv[c2.Name] = w.Row[c2.Name]
				}
			}
			if conv != nil {
				conv[c.Name] = st
			}
		}
		if conv == nil && len(w.Row) != len(s.p.Columns) {
			conv = make(projection.Row, len(s.p.Columns)) // extra keys: keep the columns only
			for _, c := range s.p.Columns {
				conv[c.Name] = w.Row[c.Name]
			}
		}
		if conv != nil {
			if !copied {
				out, copied = slices.Clone(rows), true
			}
			out[i].Row = conv
		}
	}
	return out, nil
}

// sameStored reports whether Stored left v as it was.
func sameStored(st, v any) bool {
	switch x := v.(type) {
	case nil:
		return st == nil
	case int64, float64, bool, string:
		return st == x
	}
	return false
}

// isolateUpserts writes each row under its own savepoint and returns the
// rows Postgres refused as *partition.RejectedRows.
func (s *Sink) isolateUpserts(ctx context.Context, tx pgx.Tx, rows []partition.RowWrite) error {
	rejected := map[string]string{}
	for _, w := range rows {
		args, err := s.upsertArgs([]partition.RowWrite{w}, 0, nil)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SAVEPOINT projector_row"); err != nil {
			return fmt.Errorf("savepoint: %w", err)
		}
		if _, err := tx.Exec(ctx, s.upsertSQL, args...); err != nil {
			if !rowLevel(err) {
				return fmt.Errorf("write row %q: %w", w.Key, err)
			}
			rejected[w.Key] = err.Error()
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT projector_row"); err != nil {
				return fmt.Errorf("rollback to savepoint: %w", err)
			}
			continue
		}
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT projector_row"); err != nil {
			return fmt.Errorf("release savepoint: %w", err)
		}
	}
	if len(rejected) > 0 {
		return &partition.RejectedRows{Keys: rejected}
	}
	return nil
}

// load reads the state of keys and the parked events of parkedKeys into st.
func (s *Sink) load(ctx context.Context, tx pgx.Tx, tp partition.TP, keys, parkedKeys []string, st *partition.State) error {
	if len(keys) == 0 && len(parkedKeys) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	cols := s.p.Columns
	b.Queue(s.loadSQL, keys).Query(func(rows pgx.Rows) error {
		var (
			key   string
			rowV  int64
			texts = make([]*string, len(cols))
			dest  = make([]any, 0, 2+len(cols))
		)
		dest = append(dest, &key, &rowV)
		for i := range texts {
			dest = append(dest, &texts[i])
		}
		for rows.Next() {
			if err := rows.Scan(dest...); err != nil {
				return err
			}
			row := make(projection.Row, len(cols))
			for i, c := range cols {
				val, err := c.DecodeText(texts[i])
				if err != nil {
					return fmt.Errorf("row %q: %w", key, err)
				}
				row[c.Name] = val
			}
			st.Rows[key] = row
			st.Versions[key] = max(st.Versions[key], rowV)
		}
		return rows.Err()
	})
	b.Queue(tombstoneLoadSQL, s.p.Table, keys).Query(func(rows pgx.Rows) error {
		var (
			key string
			v   int64
		)
		for rows.Next() {
			if err := rows.Scan(&key, &v); err != nil {
				return err
			}
			st.Versions[key] = max(st.Versions[key], v)
		}
		return rows.Err()
	})
	if len(parkedKeys) > 0 {
		b.Queue(parkedLoadSQL, s.identity, tp.Topic, tp.Partition, parkedKeys).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var (
					ev      partition.StoredEvent
					headers []byte
					ts      *time.Time
				)
				if err := rows.Scan(&ev.Key, &ev.Version, &ev.Offset, &ev.RecordKey, &ev.Value, &headers, &ts); err != nil {
					return err
				}
				if err := json.Unmarshal(headers, &ev.Headers); err != nil {
					return fmt.Errorf("parked %q v%d: headers: %w", ev.Key, ev.Version, err)
				}
				if ts != nil {
					ev.Timestamp = *ts
				}
				st.Parked = append(st.Parked, ev)
			}
			return rows.Err()
		})
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("load state of %d aggregates: %w", len(keys), err)
	}
	return nil
}

// queueChanges queues the batch's writes; the returned count is filled with
// the rows the upsert wrote when the batch has run.
// Rows not in the form a load returns are listed in inexact (see storedRows).
// The first existing upserts are of rows that exist.
func (s *Sink) queueChanges(b *pgx.Batch, tp partition.TP, ch partition.Changes, existing int, inexact *[]int) (*int64, error) {
	written := new(int64)
	if len(ch.Deletes) > 0 {
		keys := make([]string, len(ch.Deletes))
		versions := make([]int64, len(ch.Deletes))
		for i, d := range ch.Deletes {
			keys[i], versions[i] = d.Key, d.Version
		}
		b.Queue(s.deleteSQL, keys)
		b.Queue(tombstoneSQL, s.p.Table, keys, versions)
	}
	count := func(tag pgconn.CommandTag) error {
		*written += tag.RowsAffected()
		return nil
	}
	if existing > 0 {
		args, err := s.upsertArgs(ch.Upserts[:existing], 0, inexact)
		if err != nil {
			return nil, err
		}
		b.Queue(planIndexProbes)
		b.Queue(s.updateSQL, args...).Exec(count)
	}
	if rest := ch.Upserts[existing:]; len(rest) > 0 {
		args, err := s.upsertArgs(rest, existing, inexact)
		if err != nil {
			return nil, err
		}
		b.Queue(s.upsertSQL, args...).Exec(count)
	}
	if len(ch.Unpark) > 0 {
		keys := make([]string, len(ch.Unpark))
		versions := make([]int64, len(ch.Unpark))
		for i, u := range ch.Unpark {
			keys[i], versions[i] = u.Key, u.Version
		}
		b.Queue(unparkSQL, s.identity, tp.Topic, tp.Partition, keys, versions)
	}
	if n := len(ch.Park); n > 0 {
		var (
			keys     = make([]string, n)
			versions = make([]int64, n)
			offsets  = make([]int64, n)
			rkeys    = make([][]byte, n)
			values   = make([][]byte, n)
			headers  = make([]string, n)
			times    = make([]*time.Time, n)
		)
		for i, e := range ch.Park {
			keys[i], versions[i], offsets[i], rkeys[i], values[i] = e.Key, e.Version, e.Offset, e.RecordKey, e.Value
			headers[i] = headersJSON(e.Headers)
			times[i] = timeOrNil(e.Timestamp)
		}
		b.Queue(parkSQL, s.identity, s.p.Name, tp.Topic, tp.Partition, keys, versions, offsets, rkeys, values, headers, times)
	}
	s.queueDeadLetters(b, tp, ch.DeadLetters)
	if len(ch.Resolved) > 0 {
		b.Queue(resolvedSQL, ch.Resolved, s.identity)
	}
	return written, nil
}

func (s *Sink) queueDeadLetters(b *pgx.Batch, tp partition.TP, dls []partition.DeadLetter) {
	n := len(dls)
	if n == 0 {
		return
	}
	var (
		offsets   = make([]int64, n)
		rkeys     = make([][]byte, n)
		values    = make([][]byte, n)
		headers   = make([]string, n)
		times     = make([]*time.Time, n)
		errs      = make([]string, n)
		classes   = make([]string, n)
		attempts  = make([]int32, n)
		schemaIDs = make([]*int32, n)
		traces    = make([]*string, n)
		replays   = make([]*int64, n)
	)
	for i, d := range dls {
		offsets[i], rkeys[i], values[i], errs[i], classes[i] = d.Offset, d.RecordKey, d.Value, d.Err, d.Class
		headers[i], times[i], attempts[i] = headersJSON(d.Headers), timeOrNil(d.Timestamp), int32(max(1, d.Attempts))
		if d.SchemaID > 0 {
			v := int32(d.SchemaID)
			schemaIDs[i] = &v
		}
		if d.TraceID != "" {
			traces[i] = &d.TraceID
		}
		if d.ReplayOf > 0 {
			replays[i] = &d.ReplayOf
		}
	}
	b.Queue(deadLetterSQL, s.identity, s.p.Name, tp.Topic, tp.Partition, offsets, rkeys, values, headers, times, errs,
		classes, attempts, schemaIDs, traces, replays, s.dlqTopic)
}

// upsertArgs renders rows as one array per column plus the versions. When
// inexact is not nil, the rows holding a value not of its column kind's Go
// type (or keys that are not columns) are listed in it.
func (s *Sink) upsertArgs(rows []partition.RowWrite, base int, inexact *[]int) ([]any, error) {
	cols := make([]column, len(s.p.Columns))
	for i, c := range s.p.Columns {
		cols[i] = newColumn(c, i == 0, len(rows))
	}
	versions := make([]int64, len(rows))
	for r, w := range rows {
		versions[r] = w.Version
		exact := len(w.Row) == len(cols)
		for i, c := range s.p.Columns {
			ok, err := cols[i].set(r, w.Row[c.Name])
			if err != nil {
				return nil, fmt.Errorf("aggregate %q v%d: %w", w.Key, w.Version, err)
			}
			exact = exact && ok
		}
		if !exact && inexact != nil {
			*inexact = append(*inexact, base+r)
		}
	}
	args := make([]any, 0, len(cols)+2)
	for _, c := range cols {
		args = append(args, c.args()...)
	}
	return append(args, versions), nil
}

// Parked implements partition.Sink.
func (s *Sink) Parked(ctx context.Context, tp partition.TP) (map[string]partition.ParkedInfo, error) {
	rows, err := s.pool.Query(ctx, `SELECT key, count(*), min(parked_at) FROM projector_parked
		WHERE identity = $1 AND topic = $2 AND partition = $3 GROUP BY key`, s.identity, tp.Topic, tp.Partition)
	if err != nil {
		return nil, fmt.Errorf("list parked aggregates of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	defer rows.Close()
	out := map[string]partition.ParkedInfo{}
	for rows.Next() {
		var (
			key  string
			info partition.ParkedInfo
		)
		if err := rows.Scan(&key, &info.Count, &info.Since); err != nil {
			return nil, fmt.Errorf("list parked aggregates of %s/%d: %w", tp.Topic, tp.Partition, err)
		}
		out[key] = info
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list parked aggregates of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	return out, nil
}

// Load implements partition.Sink.
func (s *Sink) Load(ctx context.Context, tp partition.TP, keys []string) (partition.State, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return partition.State{}, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	st := partition.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
	err = s.load(ctx, tx, tp, keys, keys, &st)
	return st, err
}

// ParkedKeys lists the aggregates of the partition with parked events.
func (s *Sink) ParkedKeys(ctx context.Context, tp partition.TP) ([]string, error) {
	rows, err := s.pool.Query(ctx, parkedKeysSQL, s.identity, tp.Topic, tp.Partition)
	if err != nil {
		return nil, fmt.Errorf("list parked aggregates of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list parked aggregates of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	return keys, nil
}

func headersJSON(hs []partition.Header) string {
	if len(hs) == 0 {
		return "[]"
	}
	b, _ := json.Marshal(hs) // cannot fail: strings and byte slices
	return string(b)
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func quoteTable(name string) string { return pgx.Identifier(strings.Split(name, ".")).Sanitize() }
