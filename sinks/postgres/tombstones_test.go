package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// probeCounter counts the statements that probe projector_tombstones
// while inserting rows of aggregates assumed new.
type probeCounter struct {
	mu     sync.Mutex
	probes int
}

func (c *probeCounter) see(sql string) {
	if strings.HasPrefix(strings.TrimSpace(sql), "INSERT INTO") && strings.Contains(sql, "LEFT JOIN LATERAL (SELECT true AS found FROM projector_tombstones") {
		c.mu.Lock()
		c.probes++
		c.mu.Unlock()
	}
}

func (c *probeCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.see(d.SQL)
	return ctx
}

func (c *probeCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *probeCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *probeCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.see(d.SQL)
}

func (c *probeCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *probeCounter) take() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.probes
	c.probes = 0
	return n
}

// tracedSink is a sink of e's projection on a pool of its own, which
// counts the inserts that probe tombstones.
func tracedSink(t *testing.T, e *env) (*postgres.Sink, *probeCounter) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pc := &probeCounter{}
	cfg.ConnConfig.Tracer = pc
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := postgres.NewSink(pool, identity, e.p, "")
	s.SetStateCache(0, 0) // every aggregate not assumed new is read
	return s, pc
}

// commitNew commits v1 rows of keys as a batch of aggregates first seen
// in it, and returns the plan's calls.
func commitNew(t *testing.T, e *env, s *postgres.Sink, c *sinks.Claim, end int64, keys ...string) *gatedPlan {
	t.Helper()
	g := &gatedPlan{}
	for _, k := range keys {
		g.want = append(g.want, upsert(k, 1, "new "+k, 1))
	}
	if err := s.CommitBatch(e.ctx, *c, end, sinks.Keys{All: keys, New: keys}, g.plan); err != nil {
		t.Fatal(err)
	}
	c.NextOffset = end
	return g
}

// Rows of aggregates assumed new are inserted without probing for their
// tombstones when the sink's filter rules them out, and probed when it
// cannot: a tombstone another owner wrote before the claim, or that the
// partition wrote itself, keeps the aggregate deleted.
func TestTombstoneFilter(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	other, _ := tracedSink(t, e) // another member, earlier owner of the partition
	c := e.claim(0)
	for i, k := range []string{"gone-before", "kept"} {
		commitNew(t, e, other, &c, int64(i+1), k)
	}
	if err := other.CommitBatch(e.ctx, c, 3, sinks.Keys{All: []string{"gone-before"}}, func(sinks.State) (sinks.Changes, error) {
		return sinks.Changes{Deletes: []sinks.RowDelete{{Key: "gone-before", Version: 2}}}, nil
	}); err != nil {
		t.Fatal(err)
	}

	s, probes := tracedSink(t, e)
	c = e.claim(0) // this member takes the partition over
	commitNew(t, e, s, &c, 4, "fresh-1", "fresh-2")
	if n := probes.take(); n != 0 {
		t.Errorf("%d inserts probed tombstones for aggregates the filter rules out", n)
	}
	if ruledOut, probed := s.TombstoneChecks(); ruledOut != 2 || probed != 0 {
		t.Errorf("tombstone checks: %d ruled out, %d probed; want 2 and 0", ruledOut, probed)
	}

	// The tombstone written before the claim is in the filter.
	g := commitNew(t, e, s, &c, 5, "gone-before", "fresh-3")
	if n := probes.take(); n == 0 {
		t.Errorf("no insert probed the tombstone of gone-before")
	}
	if a, ok := e.account("gone-before"); ok {
		t.Errorf("gone-before came back as %+v; its tombstone is at v2", a)
	}
	if len(g.calls) != 2 {
		t.Errorf("planned %d times; want twice, the second time from Postgres", len(g.calls))
	}
	if ruledOut, probed := s.TombstoneChecks(); ruledOut != 3 || probed != 1 {
		t.Errorf("tombstone checks: %d ruled out, %d probed; want fresh-3 ruled out and gone-before probed", ruledOut, probed)
	}

	// So is one the partition writes itself, before it commits.
	if err := s.CommitBatch(e.ctx, c, 6, sinks.Keys{All: []string{"fresh-1"}}, func(sinks.State) (sinks.Changes, error) {
		return sinks.Changes{Deletes: []sinks.RowDelete{{Key: "fresh-1", Version: 2}}}, nil
	}); err != nil {
		t.Fatal(err)
	}
	c.NextOffset = 6
	commitNew(t, e, s, &c, 7, "fresh-1")
	if a, ok := e.account("fresh-1"); ok {
		t.Errorf("fresh-1 came back as %+v; the partition deleted it at v2", a)
	}

	// A row that exists without a tombstone fails the insert on the
	// primary key and is planned again from Postgres.
	g = commitNew(t, e, s, &c, 8, "kept", "fresh-4")
	if a, ok := e.account("kept"); !ok || *a.owner != "new kept" || a.version != 1 || len(g.calls) != 2 {
		t.Errorf("kept = %+v (present %v) after %d plans; want the v1 row kept, planned twice", a, ok, len(g.calls))
	}
	for _, k := range []string{"fresh-2", "fresh-3", "fresh-4"} {
		if a, ok := e.account(k); !ok || a.version != 1 {
			t.Errorf("%s = %+v (present %v), want written at v1", k, a, ok)
		}
	}
}

// A partition claimed again reads the tombstones again: another member
// may have owned it meanwhile and deleted aggregates the filter it had
// did not hold.
func TestTombstoneFilterRereadOnClaim(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	s, probes := tracedSink(t, e)
	other, _ := tracedSink(t, e)
	c := e.claim(0)
	commitNew(t, e, s, &c, 1, "a", "b") // s reads the (empty) tombstones
	probes.take()

	o := e.claim(1) // another member owns the partition for a while
	if err := other.CommitBatch(e.ctx, o, 2, sinks.Keys{All: []string{"a"}}, func(sinks.State) (sinks.Changes, error) {
		return sinks.Changes{Deletes: []sinks.RowDelete{{Key: "a", Version: 2}}}, nil
	}); err != nil {
		t.Fatal(err)
	}

	c = e.claim(2) // and s has it back
	commitNew(t, e, s, &c, 3, "a", "c")
	if a, ok := e.account("a"); ok {
		t.Errorf("a came back as %+v; another owner deleted it at v2", a)
	}
	if n := probes.take(); n == 0 {
		t.Errorf("no insert probed the tombstone of a")
	}
}

// A table with more tombstones than the filter holds has every insert
// of an aggregate assumed new probed, as without a filter.
func TestTombstoneFilterOverFull(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	s, probes := tracedSink(t, e)
	s.SetTombstoneFilter(2)
	c := e.claim(0)
	gone := []string{"a", "b", "c", "d"} // the filter reads at most three
	commitNew(t, e, s, &c, 1, gone...)
	if err := s.CommitBatch(e.ctx, c, 2, sinks.Keys{All: gone}, func(sinks.State) (sinks.Changes, error) {
		var ch sinks.Changes
		for _, k := range gone {
			ch.Deletes = append(ch.Deletes, sinks.RowDelete{Key: k, Version: 2})
		}
		return ch, nil
	}); err != nil {
		t.Fatal(err)
	}
	c = e.claim(2)
	probes.take()
	for i, k := range gone { // one each: a batch that finds one tombstone is planned again from Postgres
		commitNew(t, e, s, &c, int64(3+i), k, "new-"+k)
		if n := probes.take(); n == 0 {
			t.Errorf("the insert of %s did not probe tombstones although the table holds more than the filter", k)
		}
	}
	for _, k := range gone {
		if a, ok := e.account(k); ok {
			t.Errorf("%s came back as %+v; it was deleted at v2", k, a)
		}
	}
	for _, k := range gone {
		if a, ok := e.account("new-" + k); !ok || a.version != 1 {
			t.Errorf("new-%s = %+v (present %v), want written at v1", k, a, ok)
		}
	}
}

// A partition that deletes many aggregates before its filter is read
// forgets them only by asking for a read that begins after their
// transactions: one another partition began earlier does not hold them.
func TestTombstoneFilterAfterManyDeletes(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	s, _ := tracedSink(t, e)
	tps := []sinks.TP{{Topic: e.tp.Topic, Partition: 0}, {Topic: e.tp.Topic, Partition: 1}}
	cs, err := e.offs.Claim(e.ctx, tps)
	if err != nil {
		t.Fatal(err)
	}
	claims := make([]sinks.Claim, len(cs))
	for i, c := range cs {
		if err := e.offs.Init(e.ctx, c, 0); err != nil {
			t.Fatal(err)
		}
		claims[i] = sinks.Claim{TP: c.TP, Epoch: c.Epoch, Since: c.At}
	}
	p, q := &claims[0], &claims[1]
	commitNew(t, e, s, q, 1, "q-1") // the other partition reads the (empty) tombstones first

	del := func(c *sinks.Claim, end int64, keys []string) {
		t.Helper()
		err := s.CommitBatch(e.ctx, *c, end, sinks.Keys{All: keys}, func(sinks.State) (sinks.Changes, error) {
			var ch sinks.Changes
			for _, k := range keys {
				ch.Deletes = append(ch.Deletes, sinks.RowDelete{Key: k, Version: 2})
			}
			return ch, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		c.NextOffset = end
	}
	many := make([]string, 10_001)
	for i := range many {
		many[i] = fmt.Sprintf("gone-%05d", i)
	}
	del(p, 1, many)
	del(p, 2, []string{"one more"})
	commitNew(t, e, s, p, 3, "gone-00000", "new")
	if a, ok := e.account("gone-00000"); ok {
		t.Errorf("gone-00000 came back as %+v; it was deleted at v2", a)
	}
	if a, ok := e.account("new"); !ok || a.version != 1 {
		t.Errorf("new = %+v (present %v), want written at v1", a, ok)
	}
}

// A first event sent again, of an aggregate whose row exists but which
// the cache does not hold, fails the insert the filter let through on the
// primary key: the batch is planned again from Postgres, and the
// partition keeps what its cache holds of the others.
func TestTombstoneFilterKeepsTheCacheOnAnExistingRow(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	other, _ := tracedSink(t, e) // wrote x's row, which e.sink has never seen
	c := e.claim(0)
	commitNew(t, e, e.sink, &c, 1, "a", "b")
	commitNew(t, e, other, &c, 2, "x")
	before := e.sink.CacheStats()
	if before.Entries != 2 {
		t.Fatalf("the cache holds %d entries, want a and b", before.Entries)
	}
	g := commitNew(t, e, e.sink, &c, 3, "x", "y")
	if len(g.calls) != 2 {
		t.Errorf("planned %d times; want twice, the second time from Postgres", len(g.calls))
	}
	if a, ok := e.account("x"); !ok || a.version != 1 || *a.owner != "new x" {
		t.Errorf("x = %+v (present %v), want its row kept", a, ok)
	}
	if got := e.sink.CacheStats().Entries; got != 4 {
		t.Errorf("the cache holds %d entries after the batch, want a, b, x and y: it was dropped", got)
	}
}
