package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// Sink writes one projection's rows and the partition offsets of one
// consumer identity.
type Sink struct {
	pool     *pgxpool.Pool
	identity string
	p        *projection.Projection

	dlqTopic string
	cache    *stateCache
	tombs    *tombstoneFilter
	// readsRows is false for a projection whose fold builds every row from
	// the event alone: only aggregates' versions and whether their row
	// exists are read and cached, never the rows.
	readsRows bool
	// Aggregates batches found in the cache and read from Postgres
	// instead (see CacheStats).
	hits, misses atomic.Int64
	// Rows of aggregates assumed new the tombstone filter ruled out, and
	// those checked in Postgres (see TombstoneChecks).
	ruledOut, probed atomic.Int64
	// acquireTimeout bounds each wait for a connection of the pool (see
	// DefaultAcquireTimeout).
	acquireTimeout time.Duration
	// pkey is the name of the table's primary key, once looked up (see
	// keyConflict).
	pkey atomic.Pointer[string]
	// unsure holds the batches whose COMMIT lost its reply (see
	// commitLanded).
	unsure unsureCommits

	sql statements
}

// CacheStats reports the state cache's contents and hit counts.
func (s *Sink) CacheStats() sinks.CacheStats {
	entries, bytes := s.cache.usage()
	return sinks.CacheStats{Entries: entries, Bytes: bytes, Hits: s.hits.Load(), Misses: s.misses.Load()}
}

// TombstoneChecks reports, since the sink was made, how many rows of
// aggregates assumed new were inserted without looking for a tombstone
// (the filter ruled one out) and how many after probing Postgres for it,
// per attempt of a batch.
func (s *Sink) TombstoneChecks() (ruledOut, probed int64) {
	return s.ruledOut.Load(), s.probed.Load()
}

// statements are the SQL of a projection's table (see rowSQL).
type statements struct {
	load      string // rows (or versions), by key
	upsert    string // insert or update, one row at a time (isolated rows)
	update    string // rows known to exist
	insert    string // rows known not to exist
	insertNew string // rows of aggregates assumed new
	del       string
}

var (
	_ sinks.Sink              = (*Sink)(nil)
	_ sinks.Peeker            = (*Sink)(nil)
	_ sinks.Forgetter         = (*Sink)(nil)
	_ sinks.CacheReporter     = (*Sink)(nil)
	_ sinks.TombstoneReporter = (*Sink)(nil)
)

// NewSink prepares the statements of projection p for identity. Call
// Migrate first. With dlqTopic set, every new dead letter is also queued
// (in the same transaction) for publishing to that Kafka topic.
func NewSink(pool *pgxpool.Pool, identity string, p *projection.Projection, dlqTopic string) *Sink {
	s := &Sink{pool: pool, identity: identity, p: p, dlqTopic: dlqTopic, readsRows: p.FoldReadsRow(), acquireTimeout: DefaultAcquireTimeout}
	s.cache = newStateCache(DefaultStateCacheRows, DefaultStateCacheBytes, p.Columns, s.readsRows)
	s.tombs = newTombstoneFilter(p.Table, DefaultTombstoneFilterKeys)
	s.sql = rowSQL(p)
	return s
}

// SetTombstoneFilter sets the most tombstones of the table the sink reads
// into memory to rule out (see DefaultTombstoneFilterKeys); with more, or
// with 0, the row of every aggregate assumed new is inserted only after
// probing for its tombstone. Call it before the first batch.
func (s *Sink) SetTombstoneFilter(keys int) {
	s.tombs = newTombstoneFilter(s.p.Table, keys)
}

// SetStateCache sets how many aggregates' rows the sink keeps in memory
// (across its partitions), at most rows of them taking at most bytes (see
// DefaultStateCacheBytes), so that a batch reads only the others from
// Postgres; 0 for either turns the cache off. Call it before the first
// batch.
func (s *Sink) SetStateCache(rows int, bytes int64) {
	s.cache = newStateCache(rows, bytes, s.p.Columns, s.readsRows)
}

// SetAcquireTimeout sets how long a batch waits for a connection of the
// pool before it fails and is retried (see DefaultAcquireTimeout; 0 or
// less keeps the default). Call it before the first batch.
func (s *Sink) SetAcquireTimeout(d time.Duration) {
	if d > 0 {
		s.acquireTimeout = d
	}
}

// presentRow stands for a row that exists in the state of a projection
// whose fold does not read rows (see Sink.readsRows). Nothing writes to
// it.
var presentRow = projection.Row{}

// Forget drops what the sink keeps in memory about a partition; call it
// when the partition is revoked.
func (s *Sink) Forget(tp sinks.TP) {
	s.cache.drop(tp)
	s.tombs.forget(tp)
	s.unsure.forget(tp)
}

// errStaleState reports a batch planned on state (cached, or read earlier
// in the transaction) that Postgres contradicts when the rows are written;
// the transaction is rolled back and the batch planned again from Postgres.
var errStaleState = errors.New("an aggregate's row in Postgres is not what the batch was planned on (was the table written by something else?); retrying from Postgres")

// errNotNew reports a batch planned assuming that its new aggregates (see
// sinks.Keys.New) are unknown to Postgres when one of them is not, or
// when the plan does more with one of them than insert its row (which is
// where the assumption is verified); the batch is planned again from the
// state Postgres holds. Neither says anything of the cached aggregates: an
// assumed one is never cached.
var errNotNew = errors.New("an aggregate assumed new is known to Postgres")

// unverifiable reports a plan that deletes or parks aggregates assumed new
// (keys): only inserts verify the assumption, so the batch is planned again
// with those read from Postgres and the others still assumed.
type unverifiable struct{ keys map[string]bool }

func (u *unverifiable) Error() string {
	return fmt.Sprintf("%d aggregates assumed new are not only inserted", len(u.keys))
}

func (u *unverifiable) Unwrap() error { return errNotNew }

// rowSQL builds the set-based statements of a projection's table. Values
// travel as arrays (see newColumn), binary for integers, floats, booleans
// and timestamps and text for every other type, and are cast to the column
// types in SQL.
func rowSQL(p *projection.Projection) statements {
	table := quoteTable(p.Table)
	key := p.Columns[0]
	keyCol := quoteIdent(key.Name)
	// A key is compared as its type without a length: cast to
	// varchar(n), a key too long would be cut to one it is not, and
	// find that aggregate's row (see castType).
	keyType := castType(key.Type)

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
	// The statements' FROM: the column arrays, the version array and
	// statement-specific ones (name, type) as rows u.
	from := func(extra ...string) string {
		ps := append(slices.Clone(params), fmt.Sprintf("$%d::bigint[]", versions))
		ns := append(slices.Clone(unnested), "version")
		for i := 0; i < len(extra); i += 2 {
			ps = append(ps, fmt.Sprintf("$%d::%s", versions+1+i/2, extra[i+1]))
			ns = append(ns, extra[i])
		}
		return arrayRows(ps, ns)
	}

	// Rows and tombstones are looked up by separate index probes: a join
	// of both kept in a cached plan degrades with the tombstone count. The
	// LATERAL ... LIMIT 1 keeps every lookup an index probe: as a plain
	// join the planner hashes the whole table once it has grown.
	var st statements
	st.load = fmt.Sprintf(`SELECT k.key, t.version, %s
		FROM (SELECT unnest($1::text[]) AS key) AS k
		CROSS JOIN LATERAL (SELECT * FROM %s t WHERE t.%s = k.key::%s LIMIT 1) t`,
		strings.Join(sel, ", "), table, keyCol, keyType)
	if !p.FoldReadsRow() {
		st.load = fmt.Sprintf(`SELECT k.key, t.version
		FROM (SELECT unnest($1::text[]) AS key) AS k
		CROSS JOIN LATERAL (SELECT version FROM %s t WHERE t.%s = k.key::%s LIMIT 1) t`,
			table, keyCol, keyType)
	}
	st.upsert = fmt.Sprintf(`INSERT INTO %s (%s, version)
		SELECT %s, u.version FROM %s AS u
		ON CONFLICT (%s) DO UPDATE SET %s WHERE %s.version < excluded.version`,
		table, strings.Join(names, ", "), strings.Join(values, ", "), from(),
		keyCol, strings.Join(sets, ", "), table)
	// Rows known to exist are updated in place: an upsert that meets its
	// conflict also locks the row, one more WAL record per row. They are
	// found through the key's index (see planIndexProbes), which also lets
	// Postgres prune the row versions that earlier batches left dead on the
	// page, so that the update can stay on it (heap-only, no new index
	// entry). Found by ctid instead, a probe cheaper by half, rows were never
	// pruned between vacuums: a fifth of the updates left their page and
	// the table grew to twice the size, which cost more than the probes.
	updSets = append(updSets, "version = u.version")
	st.update = fmt.Sprintf(`UPDATE %s AS t SET %s
		FROM %s AS u
		WHERE t.%s = u.c0::%s AND t.version < u.version`,
		table, strings.Join(updSets, ", "), from(), keyCol, keyType)
	// Rows known not to exist are inserted without ON CONFLICT, whose
	// speculative insertion costs about as much again; a row that exists
	// after all fails the statement (see keyConflict). Rows of aggregates
	// assumed new are inserted only when the aggregate has no tombstone
	// either (an index probe each: see load); the rows inserted are
	// counted against those planned.
	st.insert = fmt.Sprintf(`INSERT INTO %s (%s, version)
		SELECT %s, u.version FROM %s AS u`,
		table, strings.Join(names, ", "), strings.Join(values, ", "), from())
	st.insertNew = fmt.Sprintf(`INSERT INTO %s (%s, version)
		SELECT %s, u.version FROM %s AS u
		LEFT JOIN LATERAL (SELECT true AS found FROM projector_tombstones t
		                   WHERE t.table_name = $%d AND t.key = u.agg LIMIT 1) t ON true
		WHERE t.found IS NULL`,
		table, strings.Join(names, ", "), strings.Join(values, ", "), from("agg", "text[]"),
		versions+2)
	st.del = fmt.Sprintf(`DELETE FROM %s WHERE %s = ANY($1::text[]::%s[])`, table, keyCol, keyType)
	return st
}

// arrayRows is a FROM item turning array parameters (params, as SQL
// expressions) into rows of the columns names, in order. The arrays are
// unnested in a SELECT list, where they run in lockstep and stream their
// rows: unnest(a, b, ...) in FROM materialises them first, which is
// slower. Arrays of different lengths pad
// the shorter ones with NULLs either way; the sink's arrays have one
// length.
func arrayRows(params, names []string) string {
	cols := make([]string, 0, len(params))
	for i, p := range params {
		cols = append(cols, fmt.Sprintf("unnest(%s) AS %s", p, names[i]))
	}
	return "(SELECT " + strings.Join(cols, ", ") + ")"
}

const (
	tombstoneLoadSQL = `SELECT k.key, t.version FROM (SELECT unnest($2::text[]) AS key) AS k
		CROSS JOIN LATERAL (SELECT version FROM projector_tombstones t
		                    WHERE t.table_name = $1 AND t.key = k.key LIMIT 1) t`
	// planIndexProbes keeps every statement of the transaction, which each
	// find rows by key, to nested loops over index probes: with a batch's
	// keys the planner may otherwise hash a large table, and a plan
	// Postgres cached once it had analyzed a table while it was tiny read
	// the whole table once per key after the table had grown. It opens each batch of statements a transaction
	// sends.
	planIndexProbes = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)`
	// parkedLoadSQL reads each aggregate's parked events through the
	// primary key (the LATERAL subquery, kept apart by OFFSET 0, runs per
	// key): written as key = ANY($4), Postgres read all of the partition's
	// parked events and filtered them, even planned for the values at
	// hand, once the table had grown since it was last analyzed.
	parkedLoadSQL = `SELECT p.key, p.version, p."offset", p.record_key, p.value, p.headers, p.record_time
		FROM unnest($4::text[]) AS k(key)
		CROSS JOIN LATERAL (SELECT * FROM projector_parked p
		                    WHERE p.identity = $1 AND p.topic = $2 AND p.partition = $3 AND p.key = k.key
		                      AND p.projection = $5
		                    OFFSET 0) p`
	parkedKeysSQL = `SELECT DISTINCT key FROM projector_parked
		WHERE identity = $1 AND topic = $2 AND partition = $3 AND projection = $4`
	parkSQL = `INSERT INTO projector_parked
		(identity, projection, topic, partition, key, version, "offset", record_key, value, headers, record_time)
		SELECT $1, $2, $3, $4, u.key, u.version, u.off, u.rkey, u.value, u.headers, u.ts
		FROM unnest($5::text[], $6::bigint[], $7::bigint[], $8::bytea[], $9::bytea[], $10::jsonb[], $11::timestamptz[])
		  AS u(key, version, off, rkey, value, headers, ts)
		ON CONFLICT DO NOTHING`
	// unparkSQL finds each event through the primary key (LATERAL ...
	// LIMIT 1, as the loads do): as a plain join, planned while the table
	// was nearly empty, it scanned the parked events once per event
	// deleted.
	unparkSQL = `DELETE FROM projector_parked p
		USING unnest($4::text[], $5::bigint[]) AS u(key, version)
		CROSS JOIN LATERAL (SELECT t.ctid AS tid FROM projector_parked t
		                    WHERE t.identity = $1 AND t.topic = $2 AND t.partition = $3
		                      AND t.key = u.key AND t.projection = $6 AND t.version = u.version LIMIT 1) t
		WHERE p.ctid = t.tid`
	tombstoneSQL = `INSERT INTO projector_tombstones (table_name, key, version)
		SELECT $1, u.key, u.version FROM unnest($2::text[], $3::bigint[]) AS u(key, version)
		ON CONFLICT (table_name, key) DO UPDATE SET version = excluded.version, deleted_at = now()
		WHERE projector_tombstones.version < excluded.version`
	// advanceSQL also records when the partition was last seen caught
	// up (see sinks.Claim.CaughtUp), in the row it updates anyway: the
	// read API's staleness costs the commit no statement.
	advanceSQL = `UPDATE projector_offsets SET next_offset = $1, updated_at = now(),
		  caught_up_at = CASE WHEN $7 THEN now() ELSE caught_up_at END
		WHERE identity = $2 AND topic = $3 AND partition = $4 AND owner_epoch = $5 AND next_offset = $6`
)

// MarkCaughtUp implements sinks.CaughtUpMarker: it records that the
// partition of claim, idle, is caught up, unless claim is no longer the
// partition's newest or its offset moved.
func (s *Sink) MarkCaughtUp(ctx context.Context, claim sinks.Claim) error {
	_, err := s.pool.Exec(ctx, `UPDATE projector_offsets SET caught_up_at = now()
		WHERE identity = $1 AND topic = $2 AND partition = $3 AND owner_epoch = $4 AND next_offset = $5`,
		s.identity, claim.Topic, claim.Partition, claim.Epoch, claim.NextOffset)
	if err != nil {
		return fmt.Errorf("mark %s/%d caught up: %w", claim.Topic, claim.Partition, err)
	}
	return nil
}

var _ sinks.CaughtUpMarker = (*Sink)(nil)

// CommitBatch implements sinks.Sink. When Postgres refuses a row (a
// data error, SQLSTATE classes 22, 23 and 54), the batch is run again with
// each row under its own savepoint to find the refused ones, which are
// returned as *sinks.RejectedRows. When it refuses a statement itself
// (see refused), the error is marked sinks.ErrBadStatement.
func (s *Sink) CommitBatch(ctx context.Context, claim sinks.Claim, end int64, keys sinks.Keys, plan func(sinks.State) (sinks.Changes, error)) error {
	ls := []*lane{{s: s, keys: keys, plan: plan}}
	return limited(ctx, s.pool, s.retired(ctx, ls, refused(s.commitBatch(ctx, claim, end, ls))))
}

// CommitLanes implements sinks.LaneCommitter: the lanes' sinks must be
// this package's, of this sink's pool and identity.
func (s *Sink) CommitLanes(ctx context.Context, claim sinks.Claim, end int64, lanes []sinks.Lane) error {
	ls := make([]*lane, len(lanes))
	for i, l := range lanes {
		o, ok := l.Sink.(*Sink)
		if !ok || o.pool != s.pool || o.identity != s.identity {
			return fmt.Errorf("commit lanes of %s/%d: lane %d is not a sink of this store and identity %q", claim.Topic, claim.Partition, i, s.identity)
		}
		ls[i] = &lane{s: o, keys: l.Keys, plan: l.Plan}
	}
	return limited(ctx, s.pool, s.retired(ctx, ls, refused(s.commitBatch(ctx, claim, end, ls))))
}

// retired turns a statement Postgres refused into sinks.ErrFenced when a
// lane's table is no longer a table: a newer generation of its projection
// cut over, renaming the table away or putting a view (which refuses
// writes, SQLSTATE PJ001) under its name. The worker then stops as a
// fenced one does, rather than halting the partition or dead-lettering
// its records.
func (s *Sink) retired(ctx context.Context, lanes []*lane, err error) error {
	var pg *pgconn.PgError
	if err == nil || !(errors.Is(err, sinks.ErrBadStatement) || errors.As(err, &pg) && pg.Code == generationViewWrite) {
		return err
	}
	for _, l := range lanes {
		var kind string
		qerr := s.pool.QueryRow(ctx, `SELECT coalesce((SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)), '')`, l.s.p.Table).Scan(&kind)
		if qerr == nil && kind != "r" && kind != "p" {
			return fmt.Errorf("%w: table %s of projection %s is no longer this generation's: a newer generation cut over (%w)", sinks.ErrFenced, l.s.p.Table, l.s.p.Name, err)
		}
	}
	return err
}

// generationViewWrite is the SQLSTATE of a write through the view of a
// projection's live generation.
const generationViewWrite = "PJ001"

var _ sinks.LaneCommitter = (*Sink)(nil)

// lane is one projection's part of a transaction: what it was given,
// and what staging it found and queued.
type lane struct {
	s    *Sink
	keys sinks.Keys
	plan func(sinks.State) (sinks.Changes, error)

	state    sinks.State
	misses   []string
	caching  bool
	ruledOut int // aggregates assumed new the tombstone filter ruled out
	g        upsertGroups
	counts   *writeCounts
	upserts  []sinks.RowWrite
	inexact  []int
	deletes  []sinks.RowDelete
}

// dropAll forgets what the lanes' sinks cache of the partition.
func dropAll(lanes []*lane, tp sinks.TP) {
	for _, l := range lanes {
		l.s.cache.drop(tp)
	}
}

func (s *Sink) commitBatch(ctx context.Context, claim sinks.Claim, end int64, lanes []*lane) error {
	if unsure, ok := s.unsure.take(claim); ok {
		// The last attempt's COMMIT went out and its reply never came: if
		// it landed, the batch is done, as that attempt planned it (plan
		// is not called again).
		landed, err := s.commitLanded(ctx, claim, unsure)
		if err != nil {
			if !errors.Is(err, sinks.ErrFenced) {
				s.unsure.note(claim, unsure)
			}
			return fmt.Errorf("read whether the last commit landed: %w", err)
		}
		if landed && unsure == end {
			return nil
		}
	}
	err := s.commit(ctx, claim, end, lanes, true, false)
	var u *unverifiable
	if errors.As(err, &u) {
		// A few aggregates first seen in the batch are also closed in it:
		// read just those.
		for _, l := range lanes {
			l.keys.New = slices.DeleteFunc(slices.Clone(l.keys.New), func(k string) bool { return u.keys[k] })
		}
		err = s.commit(ctx, claim, end, lanes, true, false)
	}
	if errors.Is(err, errNotNew) {
		// Postgres knows an aggregate assumed new: plan again from what it
		// holds (the cache is not in question).
		err = s.commit(ctx, claim, end, lanes, false, false)
	}
	if errors.Is(err, errStaleState) || keyConflict(ctx, lanes, err) {
		// Planned on what the sink remembered, which Postgres contradicts:
		// forget it and plan again from what Postgres holds.
		dropAll(lanes, claim.TP)
		err = s.commit(ctx, claim, end, lanes, false, false)
	}
	if rowLevel(err) {
		err = s.commit(ctx, claim, end, lanes, false, true)
	}
	if err != nil {
		dropAll(lanes, claim.TP)
	}
	return err
}

// keyConflict reports err to be the violation of a lane's table's
// primary key (see Sink.keyConflict).
func keyConflict(ctx context.Context, lanes []*lane, err error) bool {
	for _, l := range lanes {
		if l.s.keyConflict(ctx, err) {
			return true
		}
	}
	return false
}

// keyConflict reports err to be the violation of the table's primary key
// by an insert of a row the batch's state said did not exist. Call it
// holding no connection of the pool: it may take one (once, to learn the
// primary key's name).
func (s *Sink) keyConflict(ctx context.Context, err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != uniqueViolation {
		return false
	}
	if name := s.pkey.Load(); name != nil {
		return *name == pg.ConstraintName
	}
	conn, cerr := acquire(ctx, s.pool, s.acquireTimeout)
	if cerr != nil {
		return false // not known now: the batch is retried as it failed
	}
	defer conn.Release()
	var name string
	qerr := conn.QueryRow(ctx, `SELECT conname FROM pg_constraint
		WHERE conrelid = to_regclass($1) AND contype = 'p'`, s.p.Table).Scan(&name)
	if qerr != nil {
		return false
	}
	s.pkey.Store(&name)
	return name == pg.ConstraintName
}

// refused marks err with sinks.ErrBadStatement when Postgres refused
// the sink's statement itself rather than a row or the moment: SQLSTATE
// classes 42 (a table, column, type or function missing or different, a
// privilege missing), 0A (a feature not supported), 26 (a prepared
// statement missing, as behind a pooler that does not keep them) and 3F
// (a schema missing). Data errors (classes 22, 23, 54) that reach it are
// not rows' (those come as *sinks.RejectedRows): they are marked
// sinks.ErrRefusedData, for the worker to find the records responsible.
func refused(err error) error {
	var pg *pgconn.PgError
	if err == nil || !errors.As(err, &pg) || len(pg.Code) < 2 {
		return err
	}
	switch pg.Code[:2] {
	case "42", "0A", "26", "3F":
		return fmt.Errorf("%w: %w", sinks.ErrBadStatement, err)
	case "22", "23", "54":
		return fmt.Errorf("%w: %w", sinks.ErrRefusedData, err)
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

// commit runs the batch transaction of the lanes, with the stored offset
// written once after all of them. With assume, the aggregates of
// keys.New that are not cached are planned as new instead of read (see
// sinks.Keys); with isolate, every row is written under its own
// savepoint.
func (s *Sink) commit(ctx context.Context, claim sinks.Claim, end int64, lanes []*lane, assume, isolate bool) error {
	tx, err := begin(ctx, s.pool, s.acquireTimeout, pgx.TxOptions{})
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after commit

	b := &pgx.Batch{}
	b.Queue(planIndexProbes)
	for i, l := range lanes {
		if err := l.s.stage(ctx, tx, b, claim, l, assume, isolate); err != nil {
			var rej *sinks.RejectedRows
			if errors.As(err, &rej) {
				rej.Lane = i
			}
			return err
		}
	}
	advance := b.Queue(advanceSQL, end, s.identity, claim.Topic, claim.Partition, claim.Epoch, claim.NextOffset, claim.CaughtUp)
	var fenced bool
	advance.Exec(func(tag pgconn.CommandTag) error {
		fenced = tag.RowsAffected() == 0
		return nil
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		// The failed transaction gives its connection back before the
		// conflict is looked into on another: were it held meanwhile, as
		// many partitions as the pool has connections meeting a conflict
		// at once would each wait for a connection another one holds.
		dropStale(tx.Conn().PgConn(), err)
		_ = tx.Rollback(context.WithoutCancel(ctx)) // aborted already; a failed rollback closes the connection
		for _, l := range lanes {
			if l.ruledOut > 0 && l.s.keyConflict(ctx, err) {
				return errNotNew // most likely one of those: no reason to doubt the cache yet
			}
		}
		return fmt.Errorf("write batch: %w", err)
	}
	if fenced {
		// The stored offset moved, or a newer owner claimed the
		// partition. The offset this batch would store, under this
		// claim, says that an earlier attempt of it landed after all.
		if st, err := readStored(ctx, tx, s.identity, claim.TP, false); err == nil && st.landed(claim, end) {
			dropAll(lanes, claim.TP) // planned again on what that attempt wrote: not worth keeping
			return nil
		}
		return sinks.ErrFenced
	}
	// A row the plan expected to update but Postgres kept (it holds that
	// version or a newer one, or no longer exists) means the state came
	// from a stale cache or the table was written behind projector's back:
	// retry from Postgres. An aggregate assumed new that has a tombstone
	// was not inserted: plan again from what Postgres holds.
	for _, l := range lanes {
		if l.counts.updated < int64(l.g.existing) {
			return errStaleState
		}
		if l.counts.insertedNew < int64(l.g.assumed) {
			return errNotNew
		}
	}
	if err := tx.Commit(ctx); err != nil {
		if !outcomeUnknown(err) {
			return fmt.Errorf("commit: %w", err)
		}
		landed, perr := s.commitLanded(ctx, claim, end)
		if perr != nil {
			if !errors.Is(perr, sinks.ErrFenced) {
				s.unsure.note(claim, end)
			}
			return fmt.Errorf("commit: %w; its reply was lost, and whether it landed will be read before the batch is tried again (%w)", err, perr)
		}
		if !landed {
			return fmt.Errorf("commit: %w", err)
		}
		dropAll(lanes, claim.TP) // what the cache would hold is right, but this is rare enough not to reason about
		return nil
	}
	for _, l := range lanes {
		l.s.committed(claim, l)
	}
	return nil
}

// stage loads the lane's state in tx, plans it, and queues its writes on
// b (rows written one by one, with isolate, are written now).
func (s *Sink) stage(ctx context.Context, tx pgx.Tx, b *pgx.Batch, claim sinks.Claim, l *lane, assume, isolate bool) error {
	keys := l.keys
	l.state = sinks.State{
		Rows:     make(map[string]projection.Row, len(keys.All)),
		Versions: make(map[string]int64, len(keys.All)),
	}
	l.ruledOut, l.g, l.counts, l.inexact = 0, upsertGroups{}, &writeCounts{}, nil
	// A window is planned on what Peek found, and its aggregates assumed
	// new are those neither the cache nor an earlier window held: nothing
	// stores them before this transaction does, so they are not looked up
	// again. (Were one held after all, its insert would fail and the
	// window be planned again from Postgres.)
	var unheld []string
	if keys.Planned {
		unheld = keys.New
	}
	misses, hits, caching := s.cache.lookupUnheld(claim, keys.All, unheld, l.state, !keys.Planned)
	read, assumed := misses, map[string]bool(nil)
	if assume && !isolate && len(keys.New) > 0 {
		read, assumed = splitNew(keys.All, misses, keys.New, true)
	}
	if caching {
		caching = s.cache.tally(claim, hits+len(read), hits)
	}
	l.misses, l.caching = misses, caching
	s.hits.Add(int64(hits))
	s.misses.Add(int64(len(read)))
	if err := s.load(ctx, tx, claim.TP, read, keys.Parked, &l.state); err != nil {
		return err
	}
	ch, err := l.plan(l.state)
	if err != nil {
		return err
	}
	if len(assumed) > 0 {
		if err := onlyInserts(ch, assumed); err != nil {
			return err
		}
		// Those surely without a tombstone are inserted as rows known
		// not to exist: one that does exist fails on the primary key.
		n := len(assumed)
		if err := s.tombs.rule(ctx, tx, claim, assumed); err != nil {
			return err
		}
		l.ruledOut = n - len(assumed)
		s.ruledOut.Add(int64(l.ruledOut))
		s.probed.Add(int64(len(assumed)))
	}
	// Rows the state says exist are updated, the others inserted, those of
	// aggregates assumed new last; upserts lists them in that order.
	var g upsertGroups
	ch.Upserts, g = groupUpserts(ch.Upserts, l.state.Rows, assumed)
	upserts, inexact := ch.Upserts, []int{} // inexact: rows storedRows must convert
	if isolate {
		if err := s.isolateUpserts(ctx, tx, ch.Upserts); err != nil {
			return err
		}
		ch.Upserts, g = nil, upsertGroups{} // written one by one above
	}
	counts, err := s.queueChanges(b, claim.TP, ch, g, &inexact)
	if err != nil {
		return err
	}
	if isolate {
		inexact = nil // not known: check every row
	}
	s.tombs.deleted(claim, ch.Deletes)
	l.g, l.counts, l.upserts, l.inexact, l.deletes = g, counts, upserts, inexact, ch.Deletes
	return nil
}

// committed keeps in the cache what the lane's committed transaction
// wrote.
func (s *Sink) committed(claim sinks.Claim, l *lane) {
	if !l.caching {
		return
	}
	stored, err := l.upserts, error(nil)
	if s.readsRows {
		stored, err = s.storedRows(l.upserts, l.inexact)
	}
	if err != nil {
		s.cache.drop(claim.TP) // committed; the next batch reads from Postgres
		return
	}
	s.cache.store(claim, l.misses, l.state, stored, l.deletes)
}

// splitNew splits misses, some of all, into the keys to read and those of
// newKeys, which are assumed new; assumed is only built when wanted. Both
// lists are in the order of all (see sinks.Keys), so one pass over it
// splits them without a set of either; lists in another order are split
// by a set of newKeys.
func splitNew(all, misses, newKeys []string, wantAssumed bool) (read []string, assumed map[string]bool) {
	read = make([]string, 0, len(misses))
	if wantAssumed {
		assumed = make(map[string]bool, len(newKeys))
	}
	m, n := 0, 0
	for _, k := range all {
		miss := m < len(misses) && misses[m] == k
		if miss {
			m++
		}
		isNew := n < len(newKeys) && newKeys[n] == k
		if isNew {
			n++
		}
		switch {
		case miss && isNew:
			if wantAssumed {
				assumed[k] = true
			}
		case miss:
			read = append(read, k)
		}
	}
	if m == len(misses) && n == len(newKeys) {
		return read, assumed
	}
	isNew := make(map[string]bool, len(newKeys))
	for _, k := range newKeys {
		isNew[k] = true
	}
	read, assumed = read[:0], nil
	if wantAssumed {
		assumed = make(map[string]bool, len(newKeys))
	}
	for _, k := range misses {
		switch {
		case !isNew[k]:
			read = append(read, k)
		case wantAssumed:
			assumed[k] = true
		}
	}
	return read, assumed
}

// onlyInserts checks that the only changes ch makes to the aggregates in
// assumed are row writes, which verify that they are new: it returns an
// *unverifiable naming those it deletes or parks, and errNotNew for a plan
// with dead letters (one may stem from a fold of an assumed aggregate's
// event that would have been stale: the batch is planned again from
// Postgres).
func onlyInserts(ch sinks.Changes, assumed map[string]bool) error {
	if len(ch.DeadLetters) > 0 {
		return errNotNew
	}
	var keys map[string]bool
	mark := func(k string) {
		if assumed[k] {
			if keys == nil {
				keys = map[string]bool{}
			}
			keys[k] = true
		}
	}
	for _, d := range ch.Deletes {
		mark(d.Key)
	}
	for _, e := range ch.Park {
		mark(e.Key)
	}
	if keys != nil {
		return &unverifiable{keys: keys}
	}
	return nil
}

// upsertGroups counts the rows of each statement, in their order in the
// batch's upserts: updates of existing rows, inserts of rows known not to
// exist, inserts of the rows of aggregates assumed new.
type upsertGroups struct{ existing, absent, assumed int }

// groupUpserts returns upserts reordered into upsertGroups: the rows that
// exist (those in rows) first, those of assumed aggregates last.
func groupUpserts(upserts []sinks.RowWrite, rows map[string]projection.Row, assumed map[string]bool) ([]sinks.RowWrite, upsertGroups) {
	group := func(w sinks.RowWrite) int {
		if _, ok := rows[w.Key]; ok {
			return 0
		}
		if assumed[w.Key] {
			return 2
		}
		return 1
	}
	var n [3]int
	groups := make([]int, len(upserts))
	for i, w := range upserts {
		groups[i] = group(w)
		n[groups[i]]++
	}
	next := [3]int{0, n[0], n[0] + n[1]}
	out := make([]sinks.RowWrite, len(upserts))
	for i, w := range upserts {
		out[next[groups[i]]] = w
		next[groups[i]]++
	}
	return out, upsertGroups{existing: n[0], absent: n[1], assumed: n[2]}
}

// storedRows returns rows as a load from Postgres would return them (see
// projection.Column.Stored), reusing those already in that form. With only
// not nil, the other rows are known to be in that form already.
func (s *Sink) storedRows(rows []sinks.RowWrite, only []int) ([]sinks.RowWrite, error) {
	out, copied := rows, false
	check := func(yield func(int, sinks.RowWrite) bool) {
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
// rows Postgres refused as *sinks.RejectedRows.
func (s *Sink) isolateUpserts(ctx context.Context, tx pgx.Tx, rows []sinks.RowWrite) error {
	rejected, invalid := map[string]string{}, map[string]bool{}
	for _, w := range rows {
		args, err := s.upsertArgs([]sinks.RowWrite{w}, 0, nil)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SAVEPOINT projector_row"); err != nil {
			return fmt.Errorf("savepoint: %w", err)
		}
		if _, err := tx.Exec(ctx, s.sql.upsert, args...); err != nil {
			if !rowLevel(err) {
				return fmt.Errorf("write row %q: %w", redact.Clip(w.Key), err)
			}
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT projector_row"); err != nil {
				return fmt.Errorf("rollback to savepoint: %w", err)
			}
			msg, cerr := s.refusedColumn(ctx, tx, w, err)
			if cerr != nil {
				return cerr
			}
			if msg == "" {
				msg = err.Error()
			}
			rejected[w.Key] = msg
			if invalidText(err) {
				invalid[w.Key] = true
			}
			continue
		}
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT projector_row"); err != nil {
			return fmt.Errorf("release savepoint: %w", err)
		}
	}
	if len(rejected) > 0 {
		return &sinks.RejectedRows{Keys: rejected, Invalid: invalid}
	}
	return nil
}

// invalidText reports err to be Postgres refusing text it cannot hold: a
// NUL byte or bytes not of the database's encoding (22021), or a \u0000
// in jsonb (22P05).
func invalidText(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (pg.Code == "22021" || pg.Code == "22P05")
}

// refusedColumn finds the column of a row Postgres refused (with
// rowErr) whose value its type does not take (Postgres's message names
// the type, not the column) by casting each value on its own, and
// returns the refusal naming that column; "" when every value casts, as
// when the row breaks a constraint instead. A value longer than its
// column's length (varchar(n), char(n), bit(n)), which a cast cuts
// short, is found by comparing it with what the cast leaves.
func (s *Sink) refusedColumn(ctx context.Context, tx pgx.Tx, w sinks.RowWrite, rowErr error) (string, error) {
	for _, c := range s.p.Columns {
		v := w.Row[c.Name]
		if v == nil || c.Kind() != projection.KindText {
			continue // numbers and booleans travel in binary, range-checked already
		}
		text, err := c.EncodeText(v)
		if err != nil {
			return fmt.Sprintf("column %s (%s): %v", c.Name, c.Type, err), nil
		}
		if _, err := tx.Exec(ctx, "SAVEPOINT projector_cast"); err != nil {
			return "", fmt.Errorf("savepoint: %w", err)
		}
		_, castErr := tx.Exec(ctx, "SELECT $1::text::"+c.Type, *text)
		undo := "RELEASE SAVEPOINT projector_cast"
		if castErr != nil {
			undo = "ROLLBACK TO SAVEPOINT projector_cast"
		}
		if _, err := tx.Exec(ctx, undo); err != nil {
			return "", fmt.Errorf("%s: %w", strings.ToLower(undo), err)
		}
		if castErr != nil {
			if !rowLevel(castErr) {
				return "", fmt.Errorf("write row %q: column %s: %w", redact.Clip(w.Key), c.Name, castErr)
			}
			return fmt.Sprintf("column %s (%s): %v", c.Name, c.Type, castErr), nil
		}
		base := castType(c.Type)
		if base == c.Type {
			continue
		}
		var cut bool
		if err := tx.QueryRow(ctx, "SELECT $1::text::"+c.Type+"::"+base+" IS DISTINCT FROM $1::text::"+base, *text).Scan(&cut); err != nil {
			return "", fmt.Errorf("write row %q: column %s: compare with its type's length: %w", redact.Clip(w.Key), c.Name, err)
		}
		if cut {
			return fmt.Sprintf("column %s (%s): %v", c.Name, c.Type, rowErr), nil
		}
	}
	return "", nil
}

// load reads the state of keys and the parked events of parkedKeys into st.
func (s *Sink) load(ctx context.Context, tx pgx.Tx, tp sinks.TP, keys, parkedKeys []string, st *sinks.State) error {
	if len(keys) == 0 && len(parkedKeys) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(planIndexProbes)
	cols := s.p.Columns
	b.Queue(s.sql.load, keys).Query(func(rows pgx.Rows) error {
		if !s.readsRows {
			var (
				key  string
				rowV int64
			)
			for rows.Next() {
				if err := rows.Scan(&key, &rowV); err != nil {
					return err
				}
				st.Rows[key] = presentRow
				st.Versions[key] = max(st.Versions[key], rowV)
			}
			return rows.Err()
		}
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
					return fmt.Errorf("row %q: %w", redact.Clip(key), err)
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
		b.Queue(parkedLoadSQL, s.identity, tp.Topic, tp.Partition, parkedKeys, s.p.Name).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var (
					ev      sinks.StoredEvent
					headers []byte
					ts      *time.Time
				)
				if err := rows.Scan(&ev.Key, &ev.Version, &ev.Offset, &ev.RecordKey, &ev.Value, &headers, &ts); err != nil {
					return err
				}
				if err := json.Unmarshal(headers, &ev.Headers); err != nil {
					return fmt.Errorf("parked %q v%d: headers: %w", redact.Clip(ev.Key), ev.Version, err)
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

// writeCounts are the rows the statements of a batch wrote, filled in when
// the batch has run.
type writeCounts struct{ updated, insertedNew int64 }

// queueChanges queues the batch's writes, the upserts grouped as g says.
// Rows not in the form a load returns are listed in inexact (see
// storedRows).
func (s *Sink) queueChanges(b *pgx.Batch, tp sinks.TP, ch sinks.Changes, g upsertGroups, inexact *[]int) (*writeCounts, error) {
	counts := new(writeCounts)
	if len(ch.Deletes) > 0 {
		keys := make([]string, len(ch.Deletes))
		versions := make([]int64, len(ch.Deletes))
		for i, d := range ch.Deletes {
			keys[i], versions[i] = d.Key, d.Version
		}
		b.Queue(s.sql.del, keys)
		b.Queue(tombstoneSQL, s.p.Table, keys, versions)
	}
	existing := ch.Upserts[:g.existing]
	absent, assumed := ch.Upserts[g.existing:g.existing+g.absent], ch.Upserts[g.existing+g.absent:]
	count := func(n *int64) func(pgconn.CommandTag) error {
		return func(tag pgconn.CommandTag) error {
			*n = tag.RowsAffected()
			return nil
		}
	}
	if len(existing) > 0 {
		args, err := s.upsertArgs(existing, 0, inexact)
		if err != nil {
			return nil, err
		}
		b.Queue(s.sql.update, args...).Exec(count(&counts.updated))
	}
	if len(absent) > 0 {
		args, err := s.upsertArgs(absent, g.existing, inexact)
		if err != nil {
			return nil, err
		}
		b.Queue(s.sql.insert, args...)
	}
	if len(assumed) > 0 {
		args, err := s.upsertArgs(assumed, g.existing+g.absent, inexact)
		if err != nil {
			return nil, err
		}
		keys := make([]string, len(assumed))
		for i, w := range assumed {
			keys[i] = w.Key
		}
		b.Queue(s.sql.insertNew, append(args, keys, s.p.Table)...).Exec(count(&counts.insertedNew))
	}
	if len(ch.Unpark) > 0 {
		keys := make([]string, len(ch.Unpark))
		versions := make([]int64, len(ch.Unpark))
		for i, u := range ch.Unpark {
			keys[i], versions[i] = u.Key, u.Version
		}
		b.Queue(unparkSQL, s.identity, tp.Topic, tp.Partition, keys, versions, s.p.Name)
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
			headers[i] = deadletters.HeadersJSON(e.Headers)
			times[i] = deadletters.TimeOrNil(e.Timestamp)
		}
		b.Queue(parkSQL, s.identity, s.p.Name, tp.Topic, tp.Partition, keys, versions, offsets, rkeys, values, headers, times)
	}
	deadletters.QueueWrite(b, s.identity, s.p.Name, tp, ch.DeadLetters, s.dlqTopic)
	deadletters.QueueResolved(b, s.identity, s.p.Name, ch.Resolved)
	deadletters.QueueRedriven(b, ch.Redriven, ch.RedrivenBy)
	return counts, nil
}

// upsertArgs renders rows as one array per column plus the versions. When
// inexact is not nil, the rows holding a value not of its column kind's Go
// type (or keys that are not columns) are listed in it.
func (s *Sink) upsertArgs(rows []sinks.RowWrite, base int, inexact *[]int) ([]any, error) {
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
				return nil, fmt.Errorf("aggregate %q v%d: %w", redact.Clip(w.Key), w.Version, err)
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

// Parked implements sinks.Sink.
func (s *Sink) Parked(ctx context.Context, tp sinks.TP) (map[string]sinks.ParkedInfo, error) {
	conn, err := acquire(ctx, s.pool, s.acquireTimeout)
	if err != nil {
		return nil, refused(fmt.Errorf("list parked aggregates of %s/%d: %w", tp.Topic, tp.Partition, err))
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, `SELECT key, count(*), min(parked_at) FROM projector_parked
		WHERE identity = $1 AND topic = $2 AND partition = $3 AND projection = $4 GROUP BY key`, s.identity, tp.Topic, tp.Partition, s.p.Name)
	if err != nil {
		return nil, refused(fmt.Errorf("list parked aggregates of %s/%d: %w", tp.Topic, tp.Partition, err))
	}
	defer rows.Close()
	out := map[string]sinks.ParkedInfo{}
	for rows.Next() {
		var (
			key  string
			info sinks.ParkedInfo
		)
		if err := rows.Scan(&key, &info.Count, &info.Since); err != nil {
			return nil, refused(fmt.Errorf("list parked aggregates of %s/%d: %w", tp.Topic, tp.Partition, err))
		}
		out[key] = info
	}
	if err := rows.Err(); err != nil {
		return nil, refused(fmt.Errorf("list parked aggregates of %s/%d: %w", tp.Topic, tp.Partition, err))
	}
	return out, nil
}

// Load implements sinks.Sink.
func (s *Sink) Load(ctx context.Context, tp sinks.TP, keys []string) (sinks.State, error) {
	tx, err := begin(ctx, s.pool, s.acquireTimeout, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return sinks.State{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	st := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
	err = s.load(ctx, tx, tp, keys, keys, &st)
	return st, refused(err)
}

// Peek implements sinks.Peeker: the state of keys as a batch loads it,
// from the state cache where it holds them and from Postgres otherwise,
// outside a transaction. Aggregates of keys.New that the cache does not
// hold are not read: the commit that writes them verifies that they are
// new. What is read is cached, as it is committed and only the
// partition's owner writes it.
func (s *Sink) Peek(ctx context.Context, claim sinks.Claim, keys sinks.Keys) (sinks.State, error) {
	st := sinks.State{
		Rows:     make(map[string]projection.Row, len(keys.All)),
		Versions: make(map[string]int64, len(keys.All)),
	}
	misses, hits, caching := s.cache.lookup(claim, keys.All, st, true)
	read := misses
	if len(keys.New) > 0 {
		read, _ = splitNew(keys.All, misses, keys.New, false)
	}
	if caching {
		caching = s.cache.tally(claim, hits+len(read), hits)
	}
	s.hits.Add(int64(hits))
	s.misses.Add(int64(len(read)))
	if len(read) == 0 && len(keys.Parked) == 0 {
		return st, nil
	}
	tx, err := begin(ctx, s.pool, s.acquireTimeout, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return sinks.State{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	if err := s.load(ctx, tx, claim.TP, read, keys.Parked, &st); err != nil {
		return sinks.State{}, refused(err)
	}
	if caching {
		s.cache.store(claim, read, st, nil, nil)
	}
	return st, nil
}

// ParkedKeys lists the aggregates of the partition with parked events.
func (s *Sink) ParkedKeys(ctx context.Context, tp sinks.TP) ([]string, error) {
	conn, err := acquire(ctx, s.pool, s.acquireTimeout)
	if err != nil {
		return nil, fmt.Errorf("list parked aggregates of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, parkedKeysSQL, s.identity, tp.Topic, tp.Partition, s.p.Name)
	if err != nil {
		return nil, fmt.Errorf("list parked aggregates of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list parked aggregates of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	return keys, nil
}

func quoteTable(name string) string { return pgx.Identifier(strings.Split(name, ".")).Sanitize() }
