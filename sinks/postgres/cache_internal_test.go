package postgres

import (
	"fmt"
	"testing"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
)

// The cache stays within its size across partitions and keeps what it
// keeps right.
func TestStateCacheBounded(t *testing.T) {
	c := newStateCache(100)
	for p := int32(0); p < 3; p++ {
		claim := partition.Claim{TP: partition.TP{Topic: "t", Partition: p}, Epoch: 1}
		for b := 0; b < 10; b++ {
			var keys []string
			var rows []partition.RowWrite
			loaded := partition.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
			for i := 0; i < 50; i++ {
				k := fmt.Sprintf("p%d-k%d", p, b*50+i)
				keys = append(keys, k)
				rows = append(rows, partition.RowWrite{Key: k, Version: int64(b + 1), Row: projection.Row{"n": int64(i)}})
			}
			c.store(claim, keys, loaded, rows, nil)
			if c.size > 100 {
				t.Fatalf("after %d batches of partition %d the cache holds %d rows, want at most 100", b+1, p, c.size)
			}
		}
	}
	total := 0
	for tp, pc := range c.parts {
		total += len(pc.rows)
		for k, a := range pc.rows {
			var p, i int
			if _, err := fmt.Sscanf(k, "p%d-k%d", &p, &i); err != nil || int32(p) != tp.Partition {
				t.Fatalf("key %s cached under partition %d", k, tp.Partition)
			}
			if a.version != int64(i/50+1) || a.row["n"] != int64(i%50) {
				t.Errorf("%s cached as v%d %v", k, a.version, a.row)
			}
		}
	}
	if total != c.size {
		t.Errorf("size %d, but %d rows held", c.size, total)
	}
	c.drop(partition.TP{Topic: "t", Partition: 2})
	if _, ok := c.parts[partition.TP{Topic: "t", Partition: 2}]; ok || c.size > total {
		t.Errorf("partition 2 still cached after drop (size %d of %d)", c.size, total)
	}
}
