package postgres_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

const numbersYAML = `projections:
  - name: numbers
    topic: numbers.events
    table: numbers
    key: id
    mode: snapshot
    columns:
      id:    {type: text, primary_key: true}
      big:   {type: bigint}
      small: {type: smallint}
      score: {type: double precision}
      ratio: {type: real}
      ok:    {type: boolean}
      name:  {type: text}
`

// planOnce runs one batch over keys, handing the state it was planned on
// to check and writing what write returns.
func (e *env) planOnce(c sinks.Claim, end int64, keys []string, write func(sinks.State) sinks.Changes) (sinks.State, error) {
	var seen sinks.State
	err := e.sink.CommitBatch(e.ctx, c, end, sinks.Keys{All: keys}, func(st sinks.State) (sinks.Changes, error) {
		seen = st
		return write(st), nil
	})
	return seen, err
}

// nextVersions commits a batch that writes the next version of each
// aggregate of keys, its balance ten times its version.
func (e *env) nextVersions(c sinks.Claim, end int64, keys []string) error {
	_, err := e.planOnce(c, end, keys, func(st sinks.State) sinks.Changes {
		var ch sinks.Changes
		for _, k := range keys {
			v := st.Versions[k] + 1
			ch.Upserts = append(ch.Upserts, upsert(k, v, "owner of "+k, v*10))
		}
		return ch
	})
	return err
}

// A batch planned on cached state sees exactly what a read from Postgres
// gives: the same versions, and rows with the same Go values (a real
// rounded to single precision, ints of any width as int64).
func TestStateCacheMatchesPostgres(t *testing.T) {
	e := newEnv(t, readingRows(parseOne(t, numbersYAML)))
	c := e.claim(0)
	rows := map[string]projection.Row{
		"n1": {"id": "n1", "big": int64(1) << 40, "small": int32(-3), "score": 1.0 / 3, "ratio": 0.1, "ok": true, "name": "x"},
		"n2": {"id": "n2", "big": nil, "small": nil, "score": nil, "ratio": nil, "ok": nil, "name": nil},
		"n3": {"id": "n3", "big": int64(7), "ratio": float32(2.5), "extra": "not a column"},
	}
	keys := []string{"n1", "n2", "n3", "absent"}
	_, err := e.planOnce(c, 1, keys, func(sinks.State) sinks.Changes {
		var ch sinks.Changes
		for k, r := range rows {
			ch.Upserts = append(ch.Upserts, sinks.RowWrite{Key: k, Version: 3, Row: r})
		}
		return ch
	})
	if err != nil {
		t.Fatal(err)
	}
	c.NextOffset = 1

	fromPG, err := e.sink.Load(e.ctx, e.tp, keys)
	if err != nil {
		t.Fatal(err)
	}
	cached, err := e.planOnce(c, 2, keys, func(sinks.State) sinks.Changes { return sinks.Changes{} })
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cached.Versions, fromPG.Versions) {
		t.Errorf("cached versions %v, Postgres has %v", cached.Versions, fromPG.Versions)
	}
	if !reflect.DeepEqual(cached.Rows, fromPG.Rows) {
		t.Errorf("cached rows\n%#v\nPostgres has\n%#v", cached.Rows, fromPG.Rows)
	}
}

// A row changed behind the sink's back, to a newer version, fails the
// batch planned on the cached state without writing anything; the batch is
// planned again from Postgres in the same call.
func TestStateCacheNoticesOutsideWrite(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)
	if _, err := e.planOnce(c, 1, []string{"a1"}, func(sinks.State) sinks.Changes {
		return sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10)}}
	}); err != nil {
		t.Fatal(err)
	}
	c.NextOffset = 1
	if _, err := e.db.Pool.Exec(e.ctx, `UPDATE accounts SET version = 5, balance = 50`); err != nil {
		t.Fatal(err)
	}
	var planned []int64
	err := e.sink.CommitBatch(e.ctx, c, 2, sinks.Keys{All: []string{"a1"}}, func(st sinks.State) (sinks.Changes, error) {
		planned = append(planned, st.Versions["a1"])
		return sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", st.Versions["a1"]+1, "ann", 11)}}, nil
	})
	if err != nil || !slices.Equal(planned, []int64{1, 5}) {
		t.Fatalf("commit = %v, planned on a1 at versions %v; want v1 (cached), then v5 (from Postgres)", err, planned)
	}
	if a, _ := e.account("a1"); a.version != 6 || *a.balance != 11 {
		t.Errorf("a1 = v%d balance %d, want v6 planned on the outside write", a.version, *a.balance)
	}
	e.wantOffset(2)
}

// A table rewritten behind the sink's back (VACUUM FULL, pg_repack) moves
// its rows; a cached aggregate's next update still reaches its own row,
// and only it, with nothing planned twice.
func TestTableRewriteUpdatesTheRightRow(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)
	keys := []string{"a", "b"}
	if _, err := e.planOnce(c, 1, keys, func(sinks.State) sinks.Changes {
		return sinks.Changes{Upserts: []sinks.RowWrite{upsert("a", 1, "ann", 10), upsert("b", 1, "bob", 20)}}
	}); err != nil {
		t.Fatal(err)
	}
	c.NextOffset = 1
	ctid := func(key string) string {
		t.Helper()
		var s string
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT ctid::text FROM accounts WHERE account_id = $1`, key).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	was := ctid("a")
	// a moves behind b, then the rewrite packs b where a was.
	if _, err := e.db.Pool.Exec(e.ctx, `UPDATE accounts SET owner = owner WHERE account_id = 'a'`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Pool.Exec(e.ctx, `VACUUM FULL accounts`); err != nil {
		t.Fatal(err)
	}
	if ctid("b") != was {
		t.Fatalf("setup: b is at %s after the rewrite, not at a's old %s", ctid("b"), was)
	}
	var plans int
	err := e.sink.CommitBatch(e.ctx, c, 2, sinks.Keys{All: []string{"a"}}, func(st sinks.State) (sinks.Changes, error) {
		plans++
		return sinks.Changes{Upserts: []sinks.RowWrite{upsert("a", 2, "ann", 77)}}, nil
	})
	if err != nil || plans != 1 {
		t.Fatalf("commit = %v after %d plans, want success on the first (the state was cached)", err, plans)
	}
	if a, _ := e.account("a"); a.version != 2 || *a.balance != 77 {
		t.Errorf("a = v%d balance %d, want v2 with 77", a.version, *a.balance)
	}
	if b, _ := e.account("b"); b.version != 1 || *b.balance != 20 || *b.owner != "bob" {
		t.Errorf("b = %+v, want untouched at v1", b)
	}
}

// A table updated batch after batch keeps its size between vacuums: the
// updates find their rows in a way that lets Postgres prune the versions
// earlier batches left dead on the page, so that the new versions stay on
// it (heap-only: no new index entry either). Found by ctid, rows were
// never pruned and the table doubled in size every few batches. It runs
// on a Postgres of its own: a transaction open anywhere on the server
// (another package's test) keeps the dead versions from being pruned.
func TestUpdatesKeepTheTableSize(t *testing.T) {
	e := newEnvOn(t, demoProjection(t), testenv.StartPostgres(t).DB(t))
	if _, err := e.db.Pool.Exec(e.ctx, `ALTER TABLE accounts SET (autovacuum_enabled = off)`); err != nil {
		t.Fatal(err)
	}
	const rows, batches = 2000, 40
	keys := make([]string, rows)
	for i := range keys {
		keys[i] = fmt.Sprintf("acc-%05d", i)
	}
	pages := func() int64 {
		t.Helper()
		var n int64
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT pg_relation_size('accounts') / 8192`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The first batch inserts every row, each later one updates an eighth
	// of them (a few rows of every page, as a batch of a large table's
	// aggregates does).
	const share = 8
	c := e.claim(0)
	var first int64
	for b := range batches {
		batch := keys
		if b > 0 {
			batch = nil
			for i := b % share; i < rows; i += share {
				batch = append(batch, keys[i])
			}
		}
		if err := e.nextVersions(c, int64(b+1), batch); err != nil {
			t.Fatalf("batch %d: %v", b, err)
		}
		c.NextOffset = int64(b + 1)
		if b == 0 {
			first = pages()
		}
	}
	if got := pages(); got > first*5/4 {
		t.Errorf("accounts grew from %d pages after the inserts to %d after %d batches of updates, want at most %d",
			first, got, batches-1, first*5/4)
	}
	// Every row was updated (batches-1)/share times, or once more.
	var n int
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FROM accounts WHERE version >= $1 AND balance = version * 10`,
		1+(batches-1)/share).Scan(&n); err != nil || n != rows {
		t.Errorf("%d rows updated at least %d times with their balance (err %v), want %d", n, (batches-1)/share, err, rows)
	}
}

// A new claim of the partition (another owner may have written in
// between) starts from Postgres, as does a sink with the cache off.
func TestStateCacheDroppedOnNewClaim(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cacheOff bool // else the partition is claimed again
	}{{name: "new claim"}, {name: "cache off", cacheOff: true}} {
		e := newEnv(t, demoProjection(t))
		if tc.cacheOff {
			e.sink.SetStateCache(0, 0)
		}
		c := e.claim(0)
		if _, err := e.planOnce(c, 1, []string{"a1"}, func(sinks.State) sinks.Changes {
			return sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10)}}
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.db.Pool.Exec(e.ctx, `UPDATE accounts SET balance = 99`); err != nil {
			t.Fatal(err)
		}
		if tc.cacheOff {
			c.NextOffset = 1
		} else {
			c = e.claim(0) // a new epoch
		}
		st, err := e.planOnce(c, 2, []string{"a1"}, func(sinks.State) sinks.Changes { return sinks.Changes{} })
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Rows["a1"]["balance"]; got != int64(99) {
			t.Errorf("%s: a1's balance planned on = %v, want 99 as Postgres has it", tc.name, got)
		}
	}
}

// A row Postgres refuses among updates of existing rows is found and
// named, and nothing of the batch is written.
func TestRejectedUpdateOfExistingRow(t *testing.T) {
	e := newEnv(t, parseOne(t, numbersYAML))
	c := e.claim(0)
	row := func(id string, small int64) projection.Row {
		return projection.Row{"id": id, "big": nil, "small": small, "score": nil, "ratio": nil, "ok": nil, "name": nil}
	}
	keys := []string{"n1", "n2"}
	if _, err := e.planOnce(c, 1, keys, func(sinks.State) sinks.Changes {
		return sinks.Changes{Upserts: []sinks.RowWrite{{Key: "n1", Version: 1, Row: row("n1", 1)}, {Key: "n2", Version: 1, Row: row("n2", 2)}}}
	}); err != nil {
		t.Fatal(err)
	}
	c.NextOffset = 1
	_, err := e.planOnce(c, 2, keys, func(st sinks.State) sinks.Changes {
		if len(st.Rows) != 2 {
			t.Errorf("planned on %d existing rows, want 2", len(st.Rows))
		}
		return sinks.Changes{Upserts: []sinks.RowWrite{
			{Key: "n1", Version: 2, Row: row("n1", 1<<20)}, // out of smallint's range
			{Key: "n2", Version: 2, Row: row("n2", 3)},
		}}
	})
	var rej *sinks.RejectedRows
	if !errors.As(err, &rej) || len(rej.Keys) != 1 || rej.Keys["n1"] == "" {
		t.Fatalf("commit = %v, want n1 rejected alone", err)
	}
	e.wantOffset(1)
	if n := e.count(`SELECT count(*) FROM numbers WHERE version = 1`); n != 2 {
		t.Errorf("%d rows still at version 1, want both: the batch is not written", n)
	}

	// A data error outside the rows (a tombstone key too long for its
	// index) reruns the batch row by row, finds every row fine, and fails
	// the batch as it is.
	_, err = e.planOnce(c, 2, keys, func(st sinks.State) sinks.Changes {
		return sinks.Changes{
			Upserts: []sinks.RowWrite{{Key: "n1", Version: 2, Row: row("n1", 5)}},
			Deletes: []sinks.RowDelete{{Key: incompressible(9000), Version: 1}},
		}
	})
	if err == nil || errors.As(err, &rej) {
		t.Fatalf("commit with an unindexable tombstone = %v, want the write error", err)
	}
	e.wantOffset(1)
	if n := e.count(`SELECT count(*) FROM numbers WHERE version = 1`); n != 2 {
		t.Errorf("%d rows still at version 1, want both: the batch is not written", n)
	}
}

// incompressible returns n bytes of text Postgres cannot compress much.
func incompressible(n int) string {
	var b strings.Builder
	x := uint64(88172645463325252)
	for b.Len() < n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b.WriteString(strconv.FormatUint(x, 36))
	}
	return b.String()[:n]
}

// A declarative snapshot projection builds every row from its event: the
// sink reads and caches only versions and which rows exist, and a batch
// planned on the cache sees what one planned on Postgres sees.
func TestSnapshotStateIsVersionsOnly(t *testing.T) {
	p := parseOne(t, numbersYAML)
	if p.FoldReadsRow() {
		t.Fatal("numbers is taken to read rows")
	}
	e := newEnv(t, p)
	c := e.claim(0)
	row := func(id string) projection.Row { return projection.Row{"id": id, "big": int64(len(id))} }
	keys := []string{"n1", "n2", "gone", "absent"}
	e.mustCommit(&c, 1, sinks.Changes{Upserts: []sinks.RowWrite{
		{Key: "n1", Version: 3, Row: row("n1")}, {Key: "n2", Version: 1, Row: row("n2")}, {Key: "gone", Version: 1, Row: row("gone")},
	}})
	e.mustCommit(&c, 2, sinks.Changes{Deletes: []sinks.RowDelete{{Key: "gone", Version: 2}}})

	check := func(from string, st sinks.State, n2 int64) {
		t.Helper()
		if want := map[string]int64{"n1": 3, "n2": n2, "gone": 2}; !reflect.DeepEqual(st.Versions, want) {
			t.Errorf("%s: versions %v, want %v", from, st.Versions, want)
		}
		if len(st.Rows) != 2 || st.Rows["n1"] == nil || st.Rows["n2"] == nil {
			t.Errorf("%s: rows %v, want n1 and n2 present", from, st.Rows)
		}
		for k, r := range st.Rows {
			if len(r) != 0 {
				t.Errorf("%s: row %s read as %v, want only its presence", from, k, r)
			}
		}
	}
	fromPG, err := e.sink.Load(e.ctx, e.tp, keys)
	if err != nil {
		t.Fatal(err)
	}
	check("Postgres", fromPG, 1)
	// The first batch reads Postgres and fills the cache, the second
	// plans on the cache; each moves n2 on by the update of an existing
	// row.
	for i, from := range []string{"a batch reading Postgres", "a batch planned on the cache"} {
		st, err := e.planOnce(c, int64(3+i), keys, func(st sinks.State) sinks.Changes {
			v := st.Versions["n2"] + 1
			return sinks.Changes{Upserts: []sinks.RowWrite{{Key: "n2", Version: v, Row: projection.Row{"id": "n2", "big": 100 * v}}}}
		})
		if err != nil {
			t.Fatalf("%s: %v", from, err)
		}
		c.NextOffset = int64(3 + i)
		check(from, st, int64(1+i))
	}
	if n := e.count(`SELECT count(*) FROM numbers WHERE id = 'n2' AND big = 300 AND version = 3`); n != 1 {
		t.Errorf("n2 not at v3 after the two batches")
	}
}

// CacheStats counts the aggregates batches found in the cache and those
// they read from Postgres; aggregates first seen in their batch are
// neither.
func TestCacheStatsCountHitsAndMisses(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)
	write := func(st sinks.State, keys ...string) sinks.Changes {
		var ch sinks.Changes
		for _, k := range keys {
			ch.Upserts = append(ch.Upserts, upsert(k, st.Versions[k]+1, "o", 1))
		}
		return ch
	}
	commit := func(end int64, keys sinks.Keys) {
		t.Helper()
		err := e.sink.CommitBatch(e.ctx, c, end, keys, func(st sinks.State) (sinks.Changes, error) {
			return write(st, keys.All...), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		c.NextOffset = end
	}
	// Known to Postgres, unknown to this sink's cache: written by another.
	if _, err := e.db.Pool.Exec(e.ctx, `INSERT INTO accounts (account_id, owner, balance, version) VALUES ('old', 'x', 1, 3)`); err != nil {
		t.Fatal(err)
	}
	commit(1, sinks.Keys{All: []string{"old", "new"}, New: []string{"new"}}) // old read, new assumed
	if got := e.sink.CacheStats(); got.Hits != 0 || got.Misses != 1 || got.Entries != 2 || got.Bytes <= 0 {
		t.Fatalf("after the first batch: %+v, want 0 hits, 1 miss, 2 entries", got)
	}
	commit(2, sinks.Keys{All: []string{"old", "new"}})
	if got := e.sink.CacheStats(); got.Hits != 2 || got.Misses != 1 {
		t.Errorf("after the second batch: %+v, want 2 hits, 1 miss", got)
	}
}

// A stream of mostly new aggregates, whose others are all in the cache,
// keeps the cache in use: aggregates first seen in their batch are not
// read when they miss, so they do not count against its hit rate.
func TestCacheKeptWhileMostAggregatesAreNew(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)
	var seen []string
	next := 0
	for b := int64(1); b <= 130; b++ { // 200 wanted lookups a batch: past the 20,000 of a hit-rate window
		old := seen[max(0, len(seen)-200):]
		keys := sinks.Keys{All: slices.Clone(old)}
		for range 800 {
			k := "n" + strconv.Itoa(next)
			next++
			keys.All, keys.New = append(keys.All, k), append(keys.New, k)
		}
		before := e.sink.CacheStats()
		err := e.sink.CommitBatch(e.ctx, c, b, keys, func(st sinks.State) (sinks.Changes, error) {
			var ch sinks.Changes
			for _, k := range keys.All {
				ch.Upserts = append(ch.Upserts, upsert(k, st.Versions[k]+1, "o", 1))
			}
			return ch, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		c.NextOffset = b
		if after := e.sink.CacheStats(); len(old) == 200 && after.Hits-before.Hits != 200 {
			t.Fatalf("batch %d found %d of its 200 known aggregates in the cache, want all (%+v)", b, after.Hits-before.Hits, after)
		}
		seen = append(seen, keys.New...)
	}
}

// Peek reads outside a transaction what a batch would be planned on: the
// rows and versions Postgres holds (the same as Load), leaving out the
// aggregates assumed new it does not know of; what it read is then cached,
// and a planned commit is given whether rows exist without their values.
func TestPeek(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)
	if _, err := e.planOnce(c, 1, []string{"a1", "a2"}, func(sinks.State) sinks.Changes {
		return sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 2, "ann", 10), upsert("a2", 1, "bob", 20)}}
	}); err != nil {
		t.Fatal(err)
	}
	c.NextOffset = 1
	e.sink.Forget(e.tp) // as after a restart: nothing cached
	keys := sinks.Keys{All: []string{"a1", "a2", "new"}, New: []string{"new"}}
	start := e.sink.CacheStats()
	peeked, err := e.sink.Peek(e.ctx, c, keys)
	if err != nil {
		t.Fatal(err)
	}
	fromPG, err := e.sink.Load(e.ctx, e.tp, keys.All)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(peeked.Versions, fromPG.Versions) || !reflect.DeepEqual(peeked.Rows, fromPG.Rows) {
		t.Errorf("peeked %v %v, Postgres has %v %v", peeked.Versions, peeked.Rows, fromPG.Versions, fromPG.Rows)
	}
	if before := e.sink.CacheStats(); before.Misses-start.Misses != 2 {
		t.Errorf("%d aggregates read from Postgres, want a1 and a2 (new is assumed new)", before.Misses)
	}
	before := e.sink.CacheStats()
	var planned sinks.State
	err = e.sink.CommitBatch(e.ctx, c, 2, sinks.Keys{All: []string{"a1", "a2"}, Planned: true}, func(st sinks.State) (sinks.Changes, error) {
		planned = st
		return sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 3, "ann", 11)}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if after := e.sink.CacheStats(); after.Hits-before.Hits != 2 || after.Misses != before.Misses {
		t.Errorf("the commit read %d aggregates from Postgres and found %d cached, want both cached by the peek", after.Misses-before.Misses, after.Hits-before.Hits)
	}
	if planned.Versions["a1"] != 2 || planned.Versions["a2"] != 1 || planned.Rows["a1"] == nil || len(planned.Rows["a1"]) != 0 {
		t.Errorf("planned commit given %v %v: want the versions, and rows that exist but are empty", planned.Versions, planned.Rows)
	}
	if a, _ := e.account("a1"); a.version != 3 || *a.balance != 11 {
		t.Errorf("a1 = v%d balance %d, want v3 balance 11", a.version, *a.balance)
	}
}

// A window's commit does not look up again the aggregates it assumed new,
// which Peek found the cache without and nothing stores before the commit.
// Were one cached after all, the window is not applied on that assumption:
// its insert meets the row, and its plan is given what Postgres holds.
func TestPlannedCommitOfACachedAggregateAssumedNew(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claim(0)
	if err := e.nextVersions(c, 1, []string{"x"}); err != nil { // x at v1, cached
		t.Fatal(err)
	}
	c.NextOffset = 1
	errStale := errors.New("planned on another state")
	keys := sinks.Keys{All: []string{"x", "y"}, New: []string{"x", "y"}, Planned: true}
	var last sinks.State
	err := e.sink.CommitBatch(e.ctx, c, 2, keys, func(st sinks.State) (sinks.Changes, error) {
		last = st
		for _, k := range keys.All {
			if st.Versions[k] != 0 || st.Rows[k] != nil {
				return sinks.Changes{}, fmt.Errorf("%s found at v%d: %w", k, st.Versions[k], errStale)
			}
		}
		return sinks.Changes{Upserts: []sinks.RowWrite{upsert("x", 1, "again", 5), upsert("y", 1, "new", 1)}}, nil
	})
	if !errors.Is(err, errStale) || last.Versions["x"] != 1 {
		t.Fatalf("commit: %v, last planned on x at v%d; want the plan to find x at v1 and refuse", err, last.Versions["x"])
	}
	if a, ok := e.account("x"); !ok || a.version != 1 || *a.owner != "owner of x" {
		t.Errorf("x = %+v (present %v), want its v1 row untouched", a, ok)
	}
	if _, ok := e.account("y"); ok {
		t.Error("y was written by a transaction that failed")
	}
	e.wantOffset(1)
}
