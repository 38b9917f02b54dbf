package postgres_test

import (
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projector-dev/projector/sinks"
)

// gatedPlan is a batch's plan as the worker makes it for one event per
// aggregate: it writes each of want whose version is above the state's,
// and records the state of every call.
type gatedPlan struct {
	want   []sinks.RowWrite
	delete map[string]bool // these aggregates' events delete the row instead
	calls  []sinks.State
}

func (g *gatedPlan) plan(st sinks.State) (sinks.Changes, error) {
	g.calls = append(g.calls, st)
	var ch sinks.Changes
	for _, w := range g.want {
		if st.Versions[w.Key] >= w.Version {
			continue
		}
		if g.delete[w.Key] {
			ch.Deletes = append(ch.Deletes, sinks.RowDelete{Key: w.Key, Version: w.Version})
			continue
		}
		ch.Upserts = append(ch.Upserts, w)
	}
	return ch, nil
}

// seen reports whether call i of the plan was given key's state.
func (g *gatedPlan) seen(i int, key string) bool {
	_, ok := g.calls[i].Versions[key]
	return ok
}

// Aggregates whose batch starts at version 1 are planned without reading
// them; the inserts verify that they are new, and a batch where one is not
// is planned again from Postgres, with the outcome a batch that read
// everything would have had.
func TestCommitBatchAssumesNewAggregates(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	e.sink.SetStateCache(0, 0) // every state from Postgres
	c := e.claim(0)

	// Known to Postgres: a row at v3, a deleted aggregate (tombstone v2).
	e.mustCommit(&c, 1, sinks.Changes{Upserts: []sinks.RowWrite{upsert("row", 3, "kept", 30), upsert("gone", 1, "x", 1)}})
	e.mustCommit(&c, 2, sinks.Changes{Deletes: []sinks.RowDelete{{Key: "gone", Version: 2}}})

	t.Run("new aggregates are not read", func(t *testing.T) {
		g := &gatedPlan{want: []sinks.RowWrite{upsert("n1", 1, "ann", 10), upsert("n2", 2, "bob", 20)}}
		keys := sinks.Keys{All: []string{"n1", "n2"}, New: []string{"n1", "n2"}}
		if err := e.sink.CommitBatch(e.ctx, c, 3, keys, g.plan); err != nil {
			t.Fatal(err)
		}
		c.NextOffset = 3
		if len(g.calls) != 1 || g.seen(0, "n1") || g.seen(0, "n2") {
			t.Errorf("planned %d times, state %+v; want once, without n1 and n2", len(g.calls), g.calls)
		}
		for _, w := range g.want {
			if a, ok := e.account(w.Key); !ok || a.version != w.Version || *a.owner != w.Row["owner"] {
				t.Errorf("%s = %+v (present %v), want %v", w.Key, a, ok, w.Row)
			}
		}
	})

	cases := []struct {
		name   string
		key    string
		delete bool
		want   func(t *testing.T) // the aggregate afterwards
	}{
		{"a row exists", "row", false, func(t *testing.T) {
			if a, ok := e.account("row"); !ok || a.version != 3 || *a.owner != "kept" {
				t.Errorf("row = %+v (present %v), want the v3 row kept", a, ok)
			}
		}},
		{"a tombstone exists", "gone", false, func(t *testing.T) {
			if a, ok := e.account("gone"); ok {
				t.Errorf("gone came back as %+v; its tombstone is at v2", a)
			}
		}},
		{"the batch deletes it", "row", true, func(t *testing.T) {
			if a, ok := e.account("row"); !ok || a.version != 3 {
				t.Errorf("row = %+v (present %v): a stale delete removed it", a, ok)
			}
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			end := int64(4 + i)
			g := &gatedPlan{
				want:   []sinks.RowWrite{upsert(tc.key, 1, "replayed", 99), upsert("fresh"+tc.name, 1, "new", 1)},
				delete: map[string]bool{tc.key: tc.delete},
			}
			keys := sinks.Keys{All: []string{tc.key, "fresh" + tc.name}, New: []string{tc.key, "fresh" + tc.name}}
			if err := e.sink.CommitBatch(e.ctx, c, end, keys, g.plan); err != nil {
				t.Fatal(err)
			}
			c.NextOffset = end
			e.wantOffset(end)
			if len(g.calls) != 2 || g.seen(0, tc.key) || !g.seen(1, tc.key) {
				t.Fatalf("planned %d times; want twice, the second time from the state Postgres holds", len(g.calls))
			}
			tc.want(t)
			if a, ok := e.account("fresh" + tc.name); !ok || a.version != 1 {
				t.Errorf("the new aggregate of the batch = %+v (present %v), want written once at v1", a, ok)
			}
		})
	}
}

// A row that exists although the state said it did not (the table was
// written behind the sink's back) fails the plain insert on the primary
// key; the batch is planned again from Postgres instead of failing or
// dead-lettering.
func TestCommitBatchInsertMeetsExistingRow(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)
	e.load(c, []string{"x"}, nil) // the cache now knows x has no row
	if _, err := e.db.Pool.Exec(e.ctx, `INSERT INTO accounts (account_id, owner, balance, version) VALUES ('x', 'behind', 5, 4)`); err != nil {
		t.Fatal(err)
	}
	g := &gatedPlan{want: []sinks.RowWrite{upsert("x", 2, "ours", 1), upsert("y", 1, "y", 1)}}
	if err := e.sink.CommitBatch(e.ctx, c, 1, sinks.Keys{All: []string{"x", "y"}}, g.plan); err != nil {
		t.Fatal(err)
	}
	if len(g.calls) != 2 || g.calls[1].Versions["x"] != 4 {
		t.Fatalf("planned %d times (states %+v); want a second plan seeing x at v4", len(g.calls), g.calls)
	}
	if a, ok := e.account("x"); !ok || a.version != 4 || *a.owner != "behind" {
		t.Errorf("x = %+v (present %v), want the row at v4 untouched", a, ok)
	}
	if n := e.count(`SELECT count(*) FROM projector_dead_letters`); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
	e.wantOffset(1)
}

// With a key column that is not text, the assumed aggregates are still
// checked against their tombstones (kept by key text).
func TestAssumedKeysWithBigintKey(t *testing.T) {
	p := parseOne(t, bigintKeyYAML)
	e := newEnv(t, p)
	e.sink.SetStateCache(0, 0)
	c := e.claim(0)
	e.mustCommit(&c, 1, sinks.Changes{Deletes: []sinks.RowDelete{{Key: "7", Version: 1}}})
	var calls int
	err := e.sink.CommitBatch(e.ctx, c, 2, sinks.Keys{All: []string{"7", "8"}, New: []string{"7", "8"}},
		func(st sinks.State) (sinks.Changes, error) {
			calls++
			var ch sinks.Changes
			for _, k := range []string{"7", "8"} {
				if st.Versions[k] < 1 {
					ch.Upserts = append(ch.Upserts, sinks.RowWrite{Key: k, Version: 1, Row: map[string]any{"id": k, "note": "v1"}})
				}
			}
			return ch, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := e.db.Pool.Query(e.ctx, `SELECT id FROM numbered ORDER BY id`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 || !reflect.DeepEqual(ids, []int64{8}) {
		t.Errorf("planned %d times, rows %v; want 2 plans and only 8 (7 is deleted at v1)", calls, ids)
	}
}

// An aggregate first seen in a batch that also closes it is deleted there,
// which does not verify that it was new: it alone is read from Postgres
// and the batch planned again, with the other new aggregates still assumed
// and the cached aggregates still served from the cache.
func TestAggregateOpenedAndClosedInOneBatch(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)
	_, err := e.planOnce(c, 1, []string{"kept"}, func(sinks.State) sinks.Changes {
		return sinks.Changes{Upserts: []sinks.RowWrite{upsert("kept", 1, "kept", 10)}}
	})
	if err != nil {
		t.Fatal(err)
	}
	c.NextOffset = 1
	// Written behind the sink's back, without a new version: a plan that
	// sees "behind" read kept from Postgres, not from the cache.
	if _, err := e.db.Pool.Exec(e.ctx, `UPDATE accounts SET owner = 'behind' WHERE account_id = 'kept'`); err != nil {
		t.Fatal(err)
	}

	g := &gatedPlan{
		want:   []sinks.RowWrite{upsert("born", 1, "born", 1), upsert("closed", 2, "closed", 0)},
		delete: map[string]bool{"closed": true},
	}
	keys := sinks.Keys{All: []string{"kept", "born", "closed"}, New: []string{"born", "closed"}}
	if err := e.sink.CommitBatch(e.ctx, c, 2, keys, g.plan); err != nil {
		t.Fatal(err)
	}
	e.wantOffset(2)
	if len(g.calls) != 2 {
		t.Fatalf("planned %d times, want twice", len(g.calls))
	}
	for i, st := range g.calls {
		if owner := st.Rows["kept"]["owner"]; owner != "kept" {
			t.Errorf("plan %d saw kept's owner %v, want it from the cache (kept)", i+1, owner)
		}
	}
	if a, ok := e.account("born"); !ok || a.version != 1 {
		t.Errorf("born = %+v (present %v), want inserted at v1", a, ok)
	}
	if _, ok := e.account("closed"); ok {
		t.Error("closed has a row, want it deleted")
	}
	if n := e.count(`SELECT count(*) FROM projector_tombstones WHERE key = 'closed' AND version = 2`); n != 1 {
		t.Errorf("%d tombstones of closed at v2, want 1", n)
	}
}
