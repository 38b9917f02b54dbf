package postgres_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// oneConnectionSink is a sink of e's projection, with the cache off, on a
// pool of one connection, whose prepared statements keep the plans
// Postgres settles on; commit commits a batch of changes through it.
func oneConnectionSink(t *testing.T, e *env) (*pgxpool.Pool, func(c *sinks.Claim, end int64, ch sinks.Changes, keys, parked []string)) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := postgres.NewSink(pool, identity, e.p, "")
	s.SetStateCache(0, 0) // every batch reads its rows
	commit := func(c *sinks.Claim, end int64, ch sinks.Changes, keys, parked []string) {
		t.Helper()
		err := s.CommitBatch(e.ctx, *c, end, sinks.Keys{All: keys, Parked: parked}, func(sinks.State) (sinks.Changes, error) { return ch, nil })
		if err != nil {
			t.Fatal(err)
		}
		c.NextOffset = end
	}
	return pool, commit
}

// tableReads returns how many rows of table sequential and index scans
// have read, once the sink's connection has reported n changes to it (as
// counted by column changes of pg_stat_user_tables).
func tableReads(t *testing.T, e *env, pool *pgxpool.Pool, table, changes string, n int64) (rows int64) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, func() error {
		// A transaction on the sink's connection has it report its
		// statistics, at most once a second.
		if _, err := pool.Exec(e.ctx, `SELECT 1`); err != nil {
			t.Fatal(err)
		}
		var got int64
		if err := e.db.Pool.QueryRow(e.ctx, fmt.Sprintf(`SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0), %s
			FROM pg_stat_user_tables WHERE relid = $1::regclass`, changes), table).Scan(&rows, &got); err != nil {
			t.Fatal(err)
		}
		if got < n {
			return fmt.Errorf("%s: %d of %d changes reported", table, got, n)
		}
		return nil
	})
	return rows
}

// A batch's statements keep probing the key's index after the table has
// grown, although Postgres planned them once it had analyzed the table
// while it was tiny (a projection live with little traffic, then a
// backlog): a cached plan that scanned the table per key would read it
// whole for every row of the batch.
func TestPlansProbeTheIndexAfterTheTableGrew(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	pool, commit := oneConnectionSink(t, e)
	c := e.claim(0)
	var seed sinks.Changes
	for i := range 60 {
		seed.Upserts = append(seed.Upserts, upsert(fmt.Sprintf("acc-%02d", i), 1, "ann", 1))
	}
	commit(&c, 1, seed, nil, nil)
	if _, err := e.db.Pool.Exec(e.ctx, `ANALYZE accounts`); err != nil {
		t.Fatal(err)
	}
	// Postgres plans a prepared statement anew for its first five runs,
	// then settles on a plan it keeps.
	end := int64(2)
	for v := int64(2); v <= 8; v++ {
		keys := []string{"acc-01", "acc-02", "acc-03"}
		var ch sinks.Changes
		for _, k := range keys {
			ch.Upserts = append(ch.Upserts, upsert(k, v, "ann", v))
		}
		commit(&c, end, ch, keys, nil)
		end++
	}
	if _, err := e.db.Pool.Exec(e.ctx, `INSERT INTO accounts (account_id, owner, balance, version)
		SELECT 'grown-' || i, 'bob', 1, 1 FROM generate_series(1, 50000) i`); err != nil {
		t.Fatal(err)
	}
	before := tableReads(t, e, pool, "accounts", "n_tup_upd", 7*3)
	keys := []string{"acc-04", "acc-05", "acc-06"}
	var ch sinks.Changes
	for _, k := range keys {
		ch.Upserts = append(ch.Upserts, upsert(k, 2, "cy", 2))
	}
	commit(&c, end, ch, keys, nil)
	if n := tableReads(t, e, pool, "accounts", "n_tup_upd", 8*3) - before; n >= 50000 {
		t.Errorf("the batch read %d rows of the table: its statements scanned the grown table instead of probing its index", n)
	}
	for _, k := range keys {
		if a, ok := e.account(k); !ok || a.version != 2 || *a.owner != "cy" {
			t.Errorf("%s = %+v (present %v), want updated to v2", k, a, ok)
		}
	}
}

// So do a batch's reads and deletes of parked events after the
// partition's parked events have grown in number: planned on a few, they
// read all of the partition's for every batch.
func TestParkedPlansProbeTheKeyAfterTheTableGrew(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	pool, commit := oneConnectionSink(t, e)
	c := e.claim(0)
	event := func(key string, v int64) sinks.StoredEvent {
		return sinks.StoredEvent{Key: key, Version: v, Offset: v, Value: []byte("v")}
	}
	// Each batch parks an event and unparks the one parked before, having
	// read the parked events of its aggregate.
	commit(&c, 1, sinks.Changes{Park: []sinks.StoredEvent{event("p", 1)}}, nil, nil)
	if _, err := e.db.Pool.Exec(e.ctx, `ANALYZE projector_parked`); err != nil {
		t.Fatal(err)
	}
	end := int64(2)
	for v := int64(2); v <= 9; v++ {
		commit(&c, end, sinks.Changes{
			Park:   []sinks.StoredEvent{event("p", v)},
			Unpark: []sinks.ParkedRef{{Key: "p", Version: v - 1}},
		}, []string{"p"}, []string{"p"})
		end++
	}
	if _, err := e.db.Pool.Exec(e.ctx, `INSERT INTO projector_parked (identity, projection, topic, partition, key, version, "offset", value)
		SELECT $1, 'accounts', $2, $3, 'other-' || i, 2, i, 'v' FROM generate_series(1, 50000) i`, identity, e.tp.Topic, e.tp.Partition); err != nil {
		t.Fatal(err)
	}
	before := tableReads(t, e, pool, "projector_parked", "n_tup_del", 8)
	commit(&c, end, sinks.Changes{
		Park:   []sinks.StoredEvent{event("p", 10)},
		Unpark: []sinks.ParkedRef{{Key: "p", Version: 9}},
	}, []string{"p"}, []string{"p"})
	if n := tableReads(t, e, pool, "projector_parked", "n_tup_del", 9) - before; n >= 50000 {
		t.Errorf("the batch read %d parked events: its statements went through the partition's parked events instead of finding its aggregate's", n)
	}
	rows, _ := e.db.Pool.Query(e.ctx, `SELECT version FROM projector_parked WHERE key = 'p' ORDER BY version`)
	left, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != 10 {
		t.Errorf("p's parked events: %v, want v10 alone", left)
	}
}

// And so do a batch's writes of dead letters after the dead letters have
// grown in number: planned on a few, they read all of them per batch.
func TestDeadLetterPlansProbeTheKeyAfterTheTableGrew(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	pool, commit := oneConnectionSink(t, e)
	c := e.claim(0)
	dead := func(off int64) sinks.DeadLetter {
		return sinks.DeadLetter{Offset: off, Value: []byte("x"), Err: "bad", Class: "decode", Attempts: 1}
	}
	commit(&c, 1, sinks.Changes{DeadLetters: []sinks.DeadLetter{dead(0)}}, nil, nil)
	if _, err := e.db.Pool.Exec(e.ctx, `ANALYZE projector_dead_letters`); err != nil {
		t.Fatal(err)
	}
	end := int64(2)
	for ; end <= 9; end++ {
		commit(&c, end, sinks.Changes{DeadLetters: []sinks.DeadLetter{dead(end - 1)}}, nil, nil)
	}
	// Looked up while the table is small: this scan's statistics may be
	// reported late, and must not count as the batch's reads.
	var first int64
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT id FROM projector_dead_letters WHERE "offset" = 0`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Pool.Exec(e.ctx, `INSERT INTO projector_dead_letters (identity, projection, topic, partition, "offset", value, error)
		SELECT $1, 'accounts', $2, $3, 1000000 + i, 'x', 'e' FROM generate_series(1, 50000) i`, identity, e.tp.Topic, e.tp.Partition); err != nil {
		t.Fatal(err)
	}
	before := tableReads(t, e, pool, "projector_dead_letters", "n_tup_ins", 9+50000)
	// Two new dead letters, one replayed that failed again, one resolved.
	replayed := dead(1)
	replayed.ReplayOf = first + 1
	commit(&c, end, sinks.Changes{DeadLetters: []sinks.DeadLetter{dead(end - 1), replayed}, Resolved: []int64{first}}, nil, nil)
	if n := tableReads(t, e, pool, "projector_dead_letters", "n_tup_ins", 9+50000+1) - before; n >= 50000 {
		t.Errorf("the batch read %d dead letters: its statements went through all of them instead of finding the ones they write", n)
	}
	var status string
	var attempts int
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT status FROM projector_dead_letters WHERE id = $1`, first).Scan(&status); err != nil || status != "resolved" {
		t.Errorf("dead letter %d: status %q (%v), want resolved", first, status, err)
	}
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT attempts FROM projector_dead_letters WHERE id = $1`, first+1).Scan(&attempts); err != nil || attempts != 2 {
		t.Errorf("dead letter %d replayed and failed again: %d attempts (%v), want 2", first+1, attempts, err)
	}
}
