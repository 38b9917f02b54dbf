package postgres

import (
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// The cache against a model of what Postgres holds, over random batches:
// it may forget any aggregate (bounds, collisions, dropped partitions),
// but what it hands out is always what Postgres holds, and its counts are
// always those of its entries. Hashes are drawn from a few values, so that
// keys collide all the time; rows grow, shrink and keep their length; some
// writes come at or below the version Postgres holds, which it does not
// apply.
func TestStateCacheAgainstModel(t *testing.T) {
	cols := []projection.Column{{Name: "owner", Type: "text"}, {Name: "n", Type: "bigint"}}
	defer func(n int) { compactMin = n }(compactMin)
	compactMin = 0 // compact whenever a quarter of the data is unused
	rapid.Check(t, func(t *rapid.T) {
		maxRows := rapid.IntRange(1, 40).Draw(t, "max rows")
		maxBytes := int64(rapid.IntRange(200, 20_000).Draw(t, "max bytes"))
		c := newStateCache(maxRows, maxBytes, cols, true)
		if rapid.Bool().Draw(t, "colliding hashes") {
			c.hash = func(k string) uint64 { return uint64(len(k) % 3) }
		}
		type state struct {
			version int64
			row     projection.Row // nil: none, or deleted
		}
		truth := map[string]state{} // what Postgres holds
		epochs := map[int32]int64{0: 1, 1: 1}
		keyGen := rapid.Custom(func(t *rapid.T) string {
			return fmt.Sprintf("k%d%s", rapid.IntRange(0, 30).Draw(t, "key"), strings.Repeat("x", rapid.IntRange(0, 3).Draw(t, "pad")))
		})
		for step := range rapid.IntRange(1, 60).Draw(t, "batches") {
			p := int32(rapid.IntRange(0, 1).Draw(t, "partition"))
			switch rapid.IntRange(0, 9).Draw(t, "event") {
			case 0:
				c.drop(sinks.TP{Topic: "t", Partition: p})
			case 1:
				epochs[p]++ // claimed again
			}
			claim := sinks.Claim{TP: sinks.TP{Topic: "t", Partition: p}, Epoch: epochs[p]}
			keys := rapid.SliceOfNDistinct(keyGen, 1, 8, func(k string) string { return k }).Draw(t, "keys")
			for i, k := range keys {
				keys[i] = fmt.Sprintf("p%d-%s", p, k) // a key stays in its partition
			}
			st := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
			misses, _, _ := c.lookup(claim, keys, st, true)
			missed := map[string]bool{}
			for _, k := range misses {
				missed[k] = true
			}
			for _, k := range keys {
				if missed[k] {
					continue
				}
				want := truth[k]
				if got := st.Versions[k]; got != want.version || !reflect.DeepEqual(st.Rows[k], want.row) {
					t.Fatalf("batch %d: %s handed out at v%d %v, Postgres holds v%d %v", step, k, got, st.Rows[k], want.version, want.row)
				}
			}
			loaded := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
			for _, k := range misses {
				if s, ok := truth[k]; ok {
					loaded.Versions[k] = s.version
					if s.row != nil {
						loaded.Rows[k] = maps.Clone(s.row)
					}
				}
			}
			var writes []sinks.RowWrite
			var deletes []sinks.RowDelete
			for _, k := range keys {
				s := truth[k]
				v := s.version + int64(rapid.IntRange(1, 3).Draw(t, "step"))
				switch rapid.IntRange(0, 4).Draw(t, "change") {
				case 0: // not written in this batch
				case 1:
					deletes = append(deletes, sinks.RowDelete{Key: k, Version: v})
					truth[k] = state{version: v}
				case 2: // at or below the version held: Postgres keeps its row
					stale := max(0, s.version-int64(rapid.IntRange(0, 1).Draw(t, "behind")))
					writes = append(writes, sinks.RowWrite{Key: k, Version: stale, Row: projection.Row{"owner": "stale", "n": stale}})
				default:
					row := projection.Row{"owner": strings.Repeat("o", rapid.IntRange(0, 40).Draw(t, "owner")), "n": v}
					writes = append(writes, sinks.RowWrite{Key: k, Version: v, Row: row})
					truth[k] = state{version: v, row: maps.Clone(row)}
				}
			}
			c.store(claim, misses, loaded, writes, deletes)

			size, bytes := 0, int64(0)
			for _, pc := range c.parts {
				live := 0
				for _, a := range pc.ents {
					size++
					bytes += cost(a)
					live += int(a.klen) + a.slot()
				}
				if live != pc.live || live > pc.data.len() {
					t.Fatalf("batch %d: %d live bytes counted, %d held, %d in the buffer", step, pc.live, live, pc.data.len())
				}
			}
			if size != c.size || bytes != c.bytes || c.size > maxRows || c.bytes > maxBytes {
				t.Fatalf("batch %d: counted %d entries in %d bytes, %d in %d held (bounds %d, %d)", step, c.size, c.bytes, size, bytes, maxRows, maxBytes)
			}
		}
	})
}
