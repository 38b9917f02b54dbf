package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// smallPool is a pool of conns connections on url, closed when the test
// ends.
func smallPool(t *testing.T, url string, conns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// claimAll claims partitions 0 to n-1 of e's topic from offset 0.
func (e *env) claimAll(n int) []sinks.Claim {
	e.t.Helper()
	tps := make([]sinks.TP, n)
	for i := range tps {
		tps[i] = sinks.TP{Topic: e.p.Topic, Partition: int32(i)}
	}
	cs, err := e.offs.Claim(e.ctx, tps)
	if err != nil {
		e.t.Fatalf("claim: %v", err)
	}
	claims := make([]sinks.Claim, len(cs))
	for i, c := range cs {
		if err := e.offs.Init(e.ctx, c, 0); err != nil {
			e.t.Fatalf("init: %v", err)
		}
		claims[i] = sinks.Claim{TP: c.TP, Epoch: c.Epoch, NextOffset: 0, Since: c.At}
	}
	return claims
}

// More partitions than the pool has connections each insert, at the same
// moment, the first version of an aggregate Postgres already holds (a
// duplicate the member has not cached, as after partitions moved to it):
// every insert fails on the primary key at once, and each batch must
// still be planned again from Postgres and commit, rather than hold its
// failed transaction's connection while it waits for another one to
// look into the conflict.
func TestConflictsOnEveryConnectionAtOnce(t *testing.T) {
	const conns, partitions = 2, 6
	e := newEnv(t, demoProjection(t))
	pool := smallPool(t, e.db.URL, conns)
	sink := postgres.NewSink(pool, identity, e.p, "")
	claims := e.claimAll(partitions)
	for _, c := range claims {
		key := fmt.Sprintf("dup-%d", c.Partition)
		if _, err := e.db.Pool.Exec(e.ctx, `INSERT INTO accounts (account_id, owner, balance, version) VALUES ($1, 'first', 1, 1)`, key); err != nil {
			t.Fatal(err)
		}
	}

	// The first plans wait for each other, so that as many transactions
	// as the pool has connections hold one when their inserts fail.
	var (
		mu      sync.Mutex
		planned int
		full    = make(chan struct{})
	)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	errs := make([]error, len(claims))
	plans := make([]*gatedPlan, len(claims))
	var wg sync.WaitGroup
	for i, c := range claims {
		key := fmt.Sprintf("dup-%d", c.Partition)
		g := &gatedPlan{want: []sinks.RowWrite{upsert(key, 1, "again", 99)}}
		plans[i] = g
		first := true
		plan := func(st sinks.State) (sinks.Changes, error) {
			if first {
				first = false
				mu.Lock()
				if planned++; planned == conns {
					close(full)
				}
				mu.Unlock()
				select {
				case <-full:
				case <-ctx.Done():
				}
			}
			return g.plan(st)
		}
		wg.Go(func() {
			errs[i] = sink.CommitBatch(ctx, c, 1, sinks.Keys{All: []string{key}, New: []string{key}}, plan)
		})
	}
	wg.Wait()
	for i, c := range claims {
		if errs[i] != nil {
			t.Errorf("partition %d: %v", c.Partition, errs[i])
			continue
		}
		if n := len(plans[i].calls); n != 2 {
			t.Errorf("partition %d planned %d times, want twice: assumed new, then from Postgres", c.Partition, n)
		}
		key := fmt.Sprintf("dup-%d", c.Partition)
		if a, ok := e.account(key); !ok || a.version != 1 || *a.owner != "first" {
			t.Errorf("%s = %+v (present %v), want the first v1 row kept", key, a, ok)
		}
	}
	if n := e.count(`SELECT count(*) FROM projector_offsets WHERE identity = $1 AND next_offset = 1`, identity); n != partitions {
		t.Errorf("%d of %d partitions stored offset 1", n, partitions)
	}
}

// A COMMIT that lands but whose reply never arrives is a committed batch:
// the sink reads the stored offset rather than take the offset it moved
// itself for a newer owner's. When even that read fails, the next attempt
// of the batch reads it first and does not plan the batch again.
func TestCommitReplyLost(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	proxy := testenv.StartPGProxy(t, e.db.URL)
	pool := smallPool(t, proxy.URL, 4)
	sink := postgres.NewSink(pool, identity, e.p, "")
	sink.SetAcquireTimeout(2 * time.Second)
	c := e.claim(0)
	ctx := t.Context()

	proxy.DropCommitReplies(1, false)
	g := &gatedPlan{want: []sinks.RowWrite{upsert("a", 1, "ann", 10)}}
	keys := sinks.Keys{All: []string{"a"}, New: []string{"a"}}
	if err := sink.CommitBatch(ctx, c, 5, keys, g.plan); err != nil {
		t.Fatalf("a commit whose reply was lost: %v (tried again as a worker would: %v)", err, sink.CommitBatch(ctx, c, 5, keys, g.plan))
	}
	if proxy.Dropped() != 1 {
		t.Fatalf("%d COMMIT replies dropped, want 1: the test cut nothing", proxy.Dropped())
	}
	e.wantOffset(5)
	c.NextOffset = 5

	// The next batch goes on from there, and sees what the lost one wrote.
	g = &gatedPlan{want: []sinks.RowWrite{upsert("a", 2, "ann", 20)}}
	if err := sink.CommitBatch(ctx, c, 6, sinks.Keys{All: []string{"a"}}, g.plan); err != nil {
		t.Fatalf("the batch after: %v", err)
	}
	if len(g.calls) != 1 || g.calls[0].Versions["a"] != 1 {
		t.Errorf("the batch after was planned on %+v, want a at v1", g.calls)
	}
	e.wantOffset(6)
	c.NextOffset = 6

	t.Run("whether it landed cannot be read at once", func(t *testing.T) {
		proxy.DropCommitReplies(1, true)
		g := &gatedPlan{want: []sinks.RowWrite{upsert("a", 3, "ann", 30), upsert("b", 1, "bob", 1)}}
		keys := sinks.Keys{All: []string{"a", "b"}, New: []string{"b"}}
		err := sink.CommitBatch(ctx, c, 9, keys, g.plan)
		if err == nil || errors.Is(err, sinks.ErrFenced) {
			t.Fatalf("with Postgres out of reach after the lost reply: %v, want an error to retry on", err)
		}
		proxy.Accept()
		if err := sink.CommitBatch(ctx, c, 9, keys, g.plan); err != nil {
			t.Fatalf("the retry: %v", err)
		}
		if len(g.calls) != 1 {
			t.Errorf("planned %d times, want once: the retry found the batch committed", len(g.calls))
		}
		e.wantOffset(9)
		for _, w := range g.want {
			if a, ok := e.account(w.Key); !ok || a.version != w.Version {
				t.Errorf("%s = %+v (present %v), want v%d", w.Key, a, ok, w.Version)
			}
		}
		c.NextOffset = 9
	})

	t.Run("tried again by a sink that did not see it", func(t *testing.T) {
		proxy.DropCommitReplies(1, true)
		g := &gatedPlan{want: []sinks.RowWrite{upsert("a", 4, "ann", 40)}}
		keys := sinks.Keys{All: []string{"a"}}
		if err := sink.CommitBatch(ctx, c, 12, keys, g.plan); err == nil {
			t.Fatal("with Postgres out of reach after the lost reply: no error")
		}
		proxy.Accept()
		// Planned again on what landed, the batch finds the offset at
		// its own end under its own claim.
		other := postgres.NewSink(pool, identity, e.p, "")
		if err := other.CommitBatch(ctx, c, 12, keys, g.plan); err != nil {
			t.Fatalf("the retry: %v", err)
		}
		e.wantOffset(12)
		if a, ok := e.account("a"); !ok || a.version != 4 {
			t.Errorf("a = %+v (present %v), want v4", a, ok)
		}
	})
}
