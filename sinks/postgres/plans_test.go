package postgres_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/sinks/postgres"
)

// A batch's statements keep probing the key's index after the table has
// grown, although Postgres planned them once it had analyzed the table
// while it was tiny (a projection live with little traffic, then a
// backlog): a cached plan that scanned the table per key would read it
// whole for every row of the batch.
func TestPlansProbeTheIndexAfterTheTableGrew(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	cfg, err := pgxpool.ParseConfig(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // one connection, whose prepared statements keep their plans
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := postgres.NewSink(pool, identity, e.p, "")
	s.SetStateCache(0, 0) // every batch reads its rows
	c := e.claim(0)
	commit := func(end int64, ch partition.Changes, keys []string) {
		t.Helper()
		if err := s.CommitBatch(e.ctx, c, end, partition.Keys{All: keys}, func(partition.State) (partition.Changes, error) { return ch, nil }); err != nil {
			t.Fatal(err)
		}
		c.NextOffset = end
	}
	var seed partition.Changes
	for i := range 60 {
		seed.Upserts = append(seed.Upserts, upsert(fmt.Sprintf("acc-%02d", i), 1, "ann", 1))
	}
	commit(1, seed, nil)
	if _, err := e.db.Pool.Exec(e.ctx, `ANALYZE accounts`); err != nil {
		t.Fatal(err)
	}
	// Postgres plans a prepared statement anew for its first five runs,
	// then settles on a plan it keeps.
	end := int64(2)
	for v := int64(2); v <= 8; v++ {
		keys := []string{"acc-01", "acc-02", "acc-03"}
		var ch partition.Changes
		for _, k := range keys {
			ch.Upserts = append(ch.Upserts, upsert(k, v, "ann", v))
		}
		commit(end, ch, keys)
		end++
	}
	if _, err := e.db.Pool.Exec(e.ctx, `INSERT INTO accounts (account_id, owner, balance, version)
		SELECT 'grown-' || i, 'bob', 1, 1 FROM generate_series(1, 50000) i`); err != nil {
		t.Fatal(err)
	}
	read := func() (seqRead, updated int64) {
		t.Helper()
		// A transaction on the sink's connection has it report its
		// statistics, at most once a second.
		if _, err := pool.Exec(e.ctx, `SELECT 1`); err != nil {
			t.Fatal(err)
		}
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT coalesce(seq_tup_read, 0), n_tup_upd FROM pg_stat_user_tables WHERE relid = 'accounts'::regclass`).
			Scan(&seqRead, &updated); err != nil {
			t.Fatal(err)
		}
		return seqRead, updated
	}
	deadline := time.Now().Add(20 * time.Second)
	seqBefore, updBefore := read()
	for updBefore < 7*3 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		seqBefore, updBefore = read()
	}
	if updBefore < 7*3 {
		t.Fatalf("the warm-up's 21 updates were not reported within 20s (%d)", updBefore)
	}
	keys := []string{"acc-04", "acc-05", "acc-06"}
	var ch partition.Changes
	for _, k := range keys {
		ch.Upserts = append(ch.Upserts, upsert(k, 2, "cy", 2))
	}
	commit(end, ch, keys)
	deadline = time.Now().Add(20 * time.Second)
	seqAfter, updAfter := read()
	for updAfter < updBefore+3 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		seqAfter, updAfter = read()
	}
	if updAfter < updBefore+3 {
		t.Fatalf("the batch's updates were not reported within 20s (%d, then %d)", updBefore, updAfter)
	}
	if n := seqAfter - seqBefore; n >= 50000 {
		t.Errorf("the batch read %d rows of the table by sequential scans: its statements scanned the grown table instead of probing its index", n)
	}
	for _, k := range keys {
		if a, ok := e.account(k); !ok || a.version != 2 || *a.owner != "cy" {
			t.Errorf("%s = %+v (present %v), want updated to v2", k, a, ok)
		}
	}
}
