package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// pruneCounter counts the pruning statements a pool runs and the most
// rows one of them deleted.
type pruneCounter struct {
	mu         sync.Mutex
	statements int
	most       int64
}

func (c *pruneCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(strings.TrimSpace(d.SQL), "DELETE FROM projector_tombstones\n") {
		return context.WithValue(ctx, pruneCounter{}, true)
	}
	return ctx
}

func (c *pruneCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if ctx.Value(pruneCounter{}) == nil || d.Err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.statements++
	c.most = max(c.most, d.CommandTag.RowsAffected())
}

// deleteAccounts commits deletes of keys (at version 3) and dates their
// tombstones age ago.
func deleteAccounts(t *testing.T, e *env, c *sinks.Claim, age time.Duration, keys ...string) {
	t.Helper()
	var dels []sinks.RowDelete
	for _, k := range keys {
		dels = append(dels, sinks.RowDelete{Key: k, Version: 3})
	}
	e.mustCommit(c, c.NextOffset+1, sinks.Changes{Deletes: dels})
	if _, err := e.db.Pool.Exec(e.ctx, `UPDATE projector_tombstones SET deleted_at = now() - $1::interval WHERE key = ANY($2)`,
		fmt.Sprintf("%d seconds", int(age.Seconds())), keys); err != nil {
		t.Fatal(err)
	}
}

// tombstoneKeys lists the keys with a tombstone in table.
func tombstoneKeys(t *testing.T, e *env, table string) string {
	t.Helper()
	var keys []string
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT coalesce(array_agg(key ORDER BY key), '{}') FROM projector_tombstones WHERE table_name = $1`, table).Scan(&keys); err != nil {
		t.Fatal(err)
	}
	return strings.Join(keys, ",")
}

// TestPruneTombstones: pruning deletes the tombstones of the table
// written before the cut-off, in statements of at most the batch size,
// and leaves the younger ones and other tables' alone. The version gate
// still sees the last version of an aggregate whose tombstone is kept;
// once its tombstone is pruned the aggregate is one never seen.
func TestPruneTombstones(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)
	deleteAccounts(t, e, &c, 8*24*time.Hour, "old1", "old2", "old3", "old4", "old5")
	deleteAccounts(t, e, &c, 24*time.Hour, "young1", "young2")
	if _, err := e.db.Pool.Exec(e.ctx, `INSERT INTO projector_tombstones (table_name, key, version, deleted_at)
		VALUES ('other', 'old1', 1, now() - interval '30 days')`); err != nil {
		t.Fatal(err)
	}

	cfg, err := pgxpool.ParseConfig(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pc := &pruneCounter{}
	cfg.ConnConfig.Tracer = pc
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	n, err := postgres.PruneTombstones(e.ctx, pool, e.p.Table, time.Now().Add(-7*24*time.Hour), 2)
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 {
		t.Errorf("pruned %d tombstones, want the 5 older than 7 days", n)
	}
	if pc.statements != 3 || pc.most != 2 {
		t.Errorf("pruned in %d statements of at most %d rows, want 3 of at most 2 (batches 2, 2, 1)", pc.statements, pc.most)
	}
	if got := tombstoneKeys(t, e, e.p.Table); got != "young1,young2" {
		t.Errorf("tombstones left: %s, want young1,young2", got)
	}
	if got := tombstoneKeys(t, e, "other"); got != "old1" {
		t.Errorf("another table's tombstones: %q, want old1 untouched", got)
	}

	// Nothing more is due.
	if n, err := postgres.PruneTombstones(e.ctx, pool, e.p.Table, time.Now().Add(-7*24*time.Hour), 2); n != 0 || err != nil {
		t.Errorf("pruning again: %d, %v; want 0", n, err)
	}

	// The version gate still sees young1's last version, so a late copy
	// of its events is stale; old1 is an aggregate never seen.
	st := e.load(c, []string{"young1", "old1"}, nil)
	if st.Versions["young1"] != 3 || st.Versions["old1"] != 0 {
		t.Errorf("versions after pruning: young1 v%d, old1 v%d; want v3 (tombstone kept) and v0 (pruned)", st.Versions["young1"], st.Versions["old1"])
	}
}

// TestPruneTombstonesTogether: members pruning one table at the same time
// delete every tombstone due once between them, and none fails.
func TestPruneTombstonesTogether(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)
	var keys []string
	for i := range 200 {
		keys = append(keys, fmt.Sprintf("k%03d", i))
	}
	deleteAccounts(t, e, &c, 48*time.Hour, keys...)
	var (
		wg    sync.WaitGroup
		total [4]int64
		errs  [4]error
	)
	for i := range total {
		wg.Add(1)
		go func() {
			defer wg.Done()
			total[i], errs[i] = postgres.PruneTombstones(e.ctx, e.db.Pool, e.p.Table, time.Now().Add(-24*time.Hour), 7)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		t.Fatal(err)
	}
	if sum := total[0] + total[1] + total[2] + total[3]; sum != 200 {
		t.Errorf("pruned %v tombstones between them, want 200 in all", total)
	}
	if n := e.count(`SELECT count(*) FROM projector_tombstones`); n != 0 {
		t.Errorf("%d tombstones left", n)
	}
}

// TestForgetTombstone: forgetting deletes the tombstone of a deleted
// aggregate and nothing else; finding changes nothing; an aggregate
// whose row exists is refused with its tombstone and row kept.
func TestForgetTombstone(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)
	deleteAccounts(t, e, &c, time.Hour, "gone", "other")
	e.mustCommit(&c, c.NextOffset+1, sinks.Changes{Upserts: []sinks.RowWrite{upsert("live", 1, "ann", 1)}})

	tomb, exists, err := postgres.FindTombstone(e.ctx, e.db.Pool, e.p, "gone")
	if err != nil || tomb == nil || tomb.Version != 3 || exists {
		t.Fatalf("FindTombstone(gone) = %+v, row %v, %v; want its v3 tombstone and no row", tomb, exists, err)
	}
	if got := tombstoneKeys(t, e, e.p.Table); got != "gone,other" {
		t.Fatalf("tombstones after finding: %s", got)
	}
	forgot, err := postgres.ForgetTombstone(e.ctx, e.db.Pool, e.p, "gone")
	if err != nil || forgot == nil || forgot.Key != "gone" || forgot.Version != 3 {
		t.Fatalf("ForgetTombstone(gone) = %+v, %v", forgot, err)
	}
	if got := tombstoneKeys(t, e, e.p.Table); got != "other" {
		t.Errorf("tombstones after forgetting gone: %s, want other", got)
	}
	if forgot, err := postgres.ForgetTombstone(e.ctx, e.db.Pool, e.p, "gone"); err != nil || forgot != nil {
		t.Errorf("forgetting gone again = %+v, %v; want nothing to forget", forgot, err)
	}

	// A live aggregate: refused, and a tombstone it also has (a row
	// written after all) stays.
	if _, err := e.db.Pool.Exec(e.ctx, `INSERT INTO projector_tombstones (table_name, key, version) VALUES ($1, 'live', 0)`, e.p.Table); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.ForgetTombstone(e.ctx, e.db.Pool, e.p, "live"); !errors.Is(err, postgres.ErrRowExists) {
		t.Errorf("forgetting live: %v, want ErrRowExists", err)
	}
	if got := tombstoneKeys(t, e, e.p.Table); got != "live,other" {
		t.Errorf("tombstones after a refusal: %s, want live,other", got)
	}
	if _, ok := e.account("live"); !ok {
		t.Error("live's row is gone")
	}
}

// TestForgetTombstoneKeyOfAnotherType: a key the key column's type cannot
// hold has no row, rather than failing the look-up.
func TestForgetTombstoneKeyOfAnotherType(t *testing.T) {
	p := parseOne(t, `projections:
  - name: numbered
    topic: numbered
    table: numbered
    key: id
    mode: snapshot
    columns:
      id: {type: bigint, primary_key: true}
      note: {type: text}
`)
	e := newEnv(t, p)
	if _, err := e.db.Pool.Exec(e.ctx, `INSERT INTO projector_tombstones (table_name, key, version) VALUES ('numbered', 'not a number', 2)`); err != nil {
		t.Fatal(err)
	}
	tomb, exists, err := postgres.FindTombstone(e.ctx, e.db.Pool, p, "not a number")
	if err != nil || tomb == nil || exists {
		t.Fatalf("FindTombstone = %+v, row %v, %v; want the tombstone and no row", tomb, exists, err)
	}
	if forgot, err := postgres.ForgetTombstone(e.ctx, e.db.Pool, p, "not a number"); err != nil || forgot == nil {
		t.Fatalf("ForgetTombstone = %+v, %v", forgot, err)
	}
}
