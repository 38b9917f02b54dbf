package postgres

import (
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// The cache stays within its bounds, in rows or in bytes, across
// partitions, counts what it holds exactly and keeps what it keeps right.
func TestStateCacheBounded(t *testing.T) {
	// A cached entry here: a key like p0-k123, a row of one small int.
	entry := cost(cachedAgg{klen: uint16(len("p0-k123")), rlen: 2})
	for _, tc := range []struct {
		name  string
		rows  int
		bytes int64
	}{
		{"rows", 100, 1 << 40},
		{"bytes", 1_000_000, 100 * entry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newStateCache(tc.rows, tc.bytes, []projection.Column{{Name: "n", Type: "bigint"}}, true)
			for p := int32(0); p < 3; p++ {
				claim := sinks.Claim{TP: sinks.TP{Topic: "t", Partition: p}, Epoch: 1}
				for b := 0; b < 10; b++ {
					var keys []string
					var rows []sinks.RowWrite
					loaded := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
					for i := 0; i < 50; i++ {
						k := fmt.Sprintf("p%d-k%d", p, b*50+i)
						keys = append(keys, k)
						rows = append(rows, sinks.RowWrite{Key: k, Version: int64(b + 1), Row: projection.Row{"n": int64(i)}})
					}
					c.store(claim, keys, loaded, rows, nil)
					if c.size > tc.rows || c.bytes > tc.bytes {
						t.Fatalf("after %d batches of partition %d the cache holds %d rows in %d bytes, want at most %d and %d", b+1, p, c.size, c.bytes, tc.rows, tc.bytes)
					}
				}
			}
			if c.size < 50 {
				t.Errorf("the cache holds %d rows: it evicts far more than its bound asks", c.size)
			}
			total, bytes := 0, int64(0)
			for tp, pc := range c.parts {
				total += len(pc.ents)
				for k, a := range entries(pc) {
					bytes += cost(a)
					var p, i int
					if _, err := fmt.Sscanf(k, "p%d-k%d", &p, &i); err != nil || int32(p) != tp.Partition {
						t.Fatalf("key %s cached under partition %d", k, tp.Partition)
					}
					if row := decodeRow(c.cols, pc.row(a)); a.version != int64(i/50+1) || row["n"] != int64(i%50) {
						t.Errorf("%s cached as v%d %v", k, a.version, row)
					}
				}
			}
			if total != c.size || bytes != c.bytes {
				t.Errorf("counted %d rows in %d bytes, but %d rows in %d bytes held", c.size, c.bytes, total, bytes)
			}
			c.drop(sinks.TP{Topic: "t", Partition: 2})
			if _, ok := c.parts[sinks.TP{Topic: "t", Partition: 2}]; ok || c.size > total {
				t.Errorf("partition 2 still cached after drop (size %d of %d)", c.size, total)
			}
			var left int64
			for _, pc := range c.parts {
				for _, a := range pc.ents {
					left += cost(a)
				}
			}
			if left != c.bytes {
				t.Errorf("after the drop %d bytes counted, %d held", c.bytes, left)
			}
		})
	}
}

// A partition whose batches keep missing the cache (far more aggregates
// than it holds) stops using it for a while, then tries again; one whose
// batches find their aggregates keeps it.
func TestStateCacheBypassedWhenItDoesNotPay(t *testing.T) {
	c := newStateCache(1000, 1<<40, []projection.Column{{Name: "n", Type: "bigint"}}, true)
	cold := sinks.Claim{TP: sinks.TP{Topic: "t", Partition: 0}, Epoch: 1}
	hot := sinks.Claim{TP: sinks.TP{Topic: "t", Partition: 1}, Epoch: 1}
	batch := func(claim sinks.Claim, keys []string) (hits int, caching bool) {
		st := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
		misses, hits, caching := c.lookup(claim, keys, st, true)
		if caching {
			caching = c.tally(claim, len(keys), hits)
		}
		if caching {
			loaded := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
			for _, k := range misses {
				loaded.Versions[k] = 1
			}
			c.store(claim, misses, loaded, nil, nil)
		}
		return hits, caching
	}
	hotKeys := make([]string, 100)
	for i := range hotKeys {
		hotKeys[i] = fmt.Sprintf("hot-%d", i)
	}
	next := 0
	coldKeys := func() []string {
		keys := make([]string, 500)
		for i := range keys {
			keys[i] = fmt.Sprintf("cold-%d", next)
			next++
		}
		return keys
	}
	looked := 0
	for looked < hitWindow {
		batch(cold, coldKeys())
		batch(hot, hotKeys)
		looked += 500
	}
	if _, caching := batch(cold, coldKeys()); caching {
		t.Fatalf("after %d lookups that all missed, the cold partition still caches", looked)
	}
	if n := len(c.parts[cold.TP].ents); n != 0 {
		t.Errorf("the bypassed partition still holds %d rows", n)
	}
	if hits, caching := batch(hot, hotKeys); !caching || hits != len(hotKeys) {
		t.Errorf("hot partition: %d hits of %d, caching %v; want every key from the cache", hits, len(hotKeys), caching)
	}
	for skipped := 500; skipped < bypassLookups; skipped += 500 {
		if _, caching := batch(cold, coldKeys()); caching {
			t.Fatalf("cold partition caches again after %d bypassed lookups, want %d", skipped, bypassLookups)
		}
	}
	if _, caching := batch(cold, coldKeys()); !caching {
		t.Errorf("cold partition still bypassed after %d lookups", bypassLookups)
	}
}

// Aggregates a batch plans as new are not read when they miss, so their
// misses do not count against the hit rate: a partition whose batches are
// mostly new aggregates, with the rest found in the cache, keeps caching.
func TestStateCacheNewAggregatesDoNotCountAsMisses(t *testing.T) {
	c := newStateCache(100_000, 1<<40, []projection.Column{{Name: "n", Type: "bigint"}}, true)
	claim := sinks.Claim{TP: sinks.TP{Topic: "t", Partition: 0}, Epoch: 1}
	next := 0
	var seen []string
	for looked := 0; looked < 3*hitWindow; looked += 1000 {
		keys := seen[max(0, len(seen)-200):] // 200 aggregates seen before, 800 new
		for range 1000 - len(keys) {
			keys = append(keys, fmt.Sprintf("k%d", next))
			next++
		}
		st := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
		misses, hits, caching := c.lookup(claim, keys, st, true)
		if !caching {
			t.Fatalf("after %d lookups, 80%% of them new aggregates and the rest all hits, the cache is bypassed", looked)
		}
		read := len(misses) - (1000 - min(200, len(seen))) // the new ones are not read
		if !c.tally(claim, hits+read, hits) {
			t.Fatalf("after %d lookups the cache was dropped (hits %d, read %d)", looked, hits, read)
		}
		loaded := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
		for _, k := range misses {
			loaded.Versions[k] = 1
		}
		c.store(claim, misses, loaded, nil, nil)
		seen = append(seen, misses...)
	}
}

// A row comes out of the cache as it went in, for every kind of value a
// row read from Postgres holds; a row holding anything else is not kept.
func TestStateCacheRowEncoding(t *testing.T) {
	cols := []projection.Column{
		{Name: "id", Type: "text"}, {Name: "empty", Type: "text"}, {Name: "null", Type: "text"},
		{Name: "n", Type: "bigint"}, {Name: "neg", Type: "bigint"}, {Name: "f", Type: "double precision"},
		{Name: "yes", Type: "boolean"}, {Name: "no", Type: "boolean"}, {Name: "missing", Type: "bigint"},
		{Name: "min", Type: "bigint"}, {Name: "long", Type: "text"},
	}
	row := projection.Row{
		"id": "acc-1 ünïcode", "empty": "", "null": nil, "n": int64(math.MaxInt64), "neg": int64(-7),
		"f": -0.1, "yes": true, "no": false, "extra": "not a column",
		"min": int64(math.MinInt64), "long": strings.Repeat("long text ", 40),
	}
	b, ok := appendRow(nil, cols, row)
	if !ok {
		t.Fatal("appendRow refused a row of strings, integers, floats, booleans and nulls")
	}
	want := maps.Clone(row)
	delete(want, "extra") // what a load from Postgres gives:
	want["missing"] = nil // every column, and only columns
	if got := decodeRow(cols, string(b)); !reflect.DeepEqual(got, want) {
		t.Errorf("decoded %v, want %v", got, want)
	}
	if _, ok := appendRow(nil, cols, projection.Row{"id": "a", "n": 3}); ok {
		t.Error("appendRow took an int where a row read from Postgres holds an int64")
	}

	c := newStateCache(10, 1<<40, cols, true)
	claim := sinks.Claim{TP: sinks.TP{Topic: "t"}, Epoch: 1}
	loaded := sinks.State{Rows: map[string]projection.Row{"a": row}, Versions: map[string]int64{"a": 1}}
	c.store(claim, []string{"a"}, loaded, []sinks.RowWrite{{Key: "a", Version: 2, Row: projection.Row{"id": "a", "n": 3}}}, nil)
	st := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
	if misses, _, _ := c.lookup(claim, []string{"a"}, st, true); len(misses) != 1 || c.size != 0 {
		t.Errorf("a row the cache cannot hold left %v cached (misses %v, size %d)", st.Rows["a"], misses, c.size)
	}
}

// Storing a miss that is cached after all (which batches never do) leaves
// the counts exact.
func TestStateCacheCountsAReplacedMissOnce(t *testing.T) {
	c := newStateCache(100, 1<<40, []projection.Column{{Name: "n", Type: "bigint"}}, true)
	claim := sinks.Claim{TP: sinks.TP{Topic: "t"}, Epoch: 1}
	for _, n := range []int64{1, 1 << 40} {
		loaded := sinks.State{Rows: map[string]projection.Row{"a": {"n": n}}, Versions: map[string]int64{"a": n}}
		c.store(claim, []string{"a"}, loaded, nil, nil)
	}
	a := entries(c.parts[claim.TP])["a"]
	if c.size != 1 || c.bytes != cost(a) || a.version != 1<<40 {
		t.Errorf("size %d, %d bytes, entry v%d; want 1 entry of %d bytes at the second version", c.size, c.bytes, a.version, cost(a))
	}
}

// entries is a partition's entries by key.
func entries(pc *partCache) map[string]cachedAgg {
	out := make(map[string]cachedAgg, len(pc.ents))
	for _, a := range pc.ents {
		out[string(pc.data.at(a.koff, int(a.klen)))] = a
	}
	return out
}

// Two keys of one hash never see each other's state: the second replaces
// the first, whose next lookup misses, and the counts stay exact.
func TestStateCacheHashCollision(t *testing.T) {
	cols := []projection.Column{{Name: "k", Type: "text"}}
	c := newStateCache(100, 1<<40, cols, true)
	c.hash = func(string) uint64 { return 42 }
	claim := sinks.Claim{TP: sinks.TP{Topic: "t"}, Epoch: 1}
	for _, k := range []string{"a", "bb"} {
		loaded := sinks.State{Rows: map[string]projection.Row{k: {"k": k}}, Versions: map[string]int64{k: 3}}
		c.store(claim, []string{k}, loaded, nil, nil)
	}
	st := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
	misses, hits, _ := c.lookup(claim, []string{"a", "bb"}, st, true)
	if !slices.Equal(misses, []string{"a"}) || hits != 1 || st.Rows["bb"]["k"] != "bb" || st.Rows["a"] != nil {
		t.Errorf("misses %v, hits %d, state %v: want a missed and bb's own row", misses, hits, st.Rows)
	}
	// A write of the replaced key leaves the other's entry alone.
	c.store(claim, nil, sinks.State{}, []sinks.RowWrite{{Key: "a", Version: 4, Row: projection.Row{"k": "a"}}}, nil)
	if a := entries(c.parts[claim.TP])["bb"]; c.size != 1 || c.bytes != cost(a) || a.version != 3 {
		t.Errorf("size %d, %d bytes, bb at v%d; want bb's entry alone at v3, %d bytes", c.size, c.bytes, a.version, cost(a))
	}
}

// Old rows are dropped from the cache's memory as rows are rewritten, rows
// that keep their length are rewritten in place, and a row handed out
// earlier stays as it was.
func TestStateCacheCompacts(t *testing.T) {
	cols := []projection.Column{{Name: "owner", Type: "text"}, {Name: "n", Type: "bigint"}}
	c := newStateCache(1000, 1<<40, cols, true)
	claim := sinks.Claim{TP: sinks.TP{Topic: "t"}, Epoch: 1}
	keys := make([]string, 100)
	loaded := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%03d", i)
		loaded.Rows[keys[i]], loaded.Versions[keys[i]] = projection.Row{"owner": "first " + keys[i], "n": int64(0)}, 1
	}
	c.store(claim, keys, loaded, nil, nil)
	first := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
	c.lookup(claim, keys, first, true)
	pc := c.parts[claim.TP]
	for v := int64(2); v <= 200; v++ {
		var writes []sinks.RowWrite
		for _, k := range keys {
			writes = append(writes, sinks.RowWrite{Key: k, Version: v, Row: projection.Row{"owner": strings.Repeat("o", int(v)) + k, "n": v}})
		}
		c.store(claim, nil, sinks.State{}, writes, nil)
		if limit := 2*pc.live + compactMin + 1<<10; pc.data.len() > limit {
			t.Fatalf("after version %d the partition keeps %d bytes for %d live", v, pc.data.len(), pc.live)
		}
	}
	if pc.data.capacity() > 4*pc.live+(128<<10) {
		t.Errorf("%d bytes of capacity for %d live", pc.data.capacity(), pc.live)
	}
	last := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
	c.lookup(claim, keys, last, true)
	// Rows of the same length are rewritten in place.
	size := pc.data.len()
	var writes []sinks.RowWrite
	for _, k := range keys {
		writes = append(writes, sinks.RowWrite{Key: k, Version: 201, Row: projection.Row{"owner": strings.Repeat("x", 200) + k, "n": int64(201)}})
	}
	c.store(claim, nil, sinks.State{}, writes, nil)
	if pc.data.len() != size {
		t.Errorf("rewriting rows of the same length took %d bytes more", pc.data.len()-size)
	}
	for _, k := range keys {
		if got := first.Rows[k]["owner"]; got != "first "+k {
			t.Fatalf("%s: a row handed out before changed to %v", k, got)
		}
		if got := last.Rows[k]; got["owner"] != strings.Repeat("o", 200)+k || got["n"] != int64(200) || last.Versions[k] != 200 {
			t.Fatalf("%s: handed out as v%d %v after 200 versions", k, last.Versions[k], got)
		}
	}
	now := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
	c.lookup(claim, keys, now, true)
	for _, k := range keys {
		if got := now.Rows[k]; got["owner"] != strings.Repeat("x", 200)+k || now.Versions[k] != 201 {
			t.Fatalf("%s: cached as v%d %v after the rewrite", k, now.Versions[k], got)
		}
	}
}

// A key longer than an entry can hold is not cached, and a row longer than
// a slot can be rewritten in place is appended each time, all counted
// exactly.
func TestStateCacheLongKeysAndRows(t *testing.T) {
	cols := []projection.Column{{Name: "k", Type: "text"}}
	c := newStateCache(100, 1<<40, cols, true)
	claim := sinks.Claim{TP: sinks.TP{Topic: "t"}, Epoch: 1}
	long := strings.Repeat("k", 70_000)
	loaded := sinks.State{
		Rows:     map[string]projection.Row{long: {"k": "v"}, "a": {"k": long}},
		Versions: map[string]int64{long: 1, "a": 1},
	}
	c.store(claim, []string{long, "a"}, loaded, nil, nil)
	for v := int64(2); v < 4; v++ {
		c.store(claim, nil, sinks.State{}, []sinks.RowWrite{{Key: "a", Version: v, Row: projection.Row{"k": long[:69_000]}}}, nil)
	}
	st := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
	misses, _, _ := c.lookup(claim, []string{long, "a"}, st, true)
	pc := c.parts[claim.TP]
	a := entries(pc)["a"]
	if len(misses) != 1 || misses[0] != long || st.Rows["a"]["k"] != long[:69_000] || st.Versions["a"] != 3 {
		t.Errorf("misses %d keys, a at v%d with %d bytes: want the long key missed and a's last row", len(misses), st.Versions["a"], len(st.Rows["a"]["k"].(string)))
	}
	if c.size != 1 || c.bytes != cost(a) || pc.live != 1+a.slot() || a.slot() != int(a.rlen) {
		t.Errorf("size %d, %d bytes, %d live: want a's entry alone (%d bytes, slot %d)", c.size, c.bytes, pc.live, cost(a), a.slot())
	}
}
