package postgres

import (
	"fmt"
	"testing"

	"github.com/bits-and-blooms/bloom/v3"
)

// A partition's own deletes are found whether they sit in its set beside
// the shared filter or, past ownDeletes of them, in its copy of it; the
// shared filter is never written to.
func TestPartTombstonesKeepOwnDeletes(t *testing.T) {
	shared := bloom.NewWithEstimates(100_000, tombstoneFalsePositives)
	shared.AddString("read")
	before := shared.Copy()
	p := &partTombstones{deletes: map[string]struct{}{"before the read": {}}}
	p.shared = shared
	p.spill()
	var own []string
	for i := range ownDeletes + 1 {
		k := fmt.Sprintf("deleted-%d", i)
		own = append(own, k)
		p.add(k)
		if i == 0 && p.own != nil {
			t.Fatal("copied the shared filter for one delete")
		}
	}
	if p.own == nil || p.deletes != nil {
		t.Fatalf("after %d deletes: own filter %v, set of %d; want the deletes in a copy", len(own), p.own != nil, len(p.deletes))
	}
	for _, k := range append(own, "read", "before the read") {
		if !p.has(k) {
			t.Errorf("%q: no tombstone", k)
		}
	}
	if !shared.Equal(before) {
		t.Error("the partition's deletes went into the shared filter")
	}
	misses := 0
	for i := range 10_000 {
		if p.has(fmt.Sprintf("never-%d", i)) {
			misses++
		}
	}
	if misses > 300 {
		t.Errorf("%d of 10,000 keys without a tombstone were not ruled out", misses)
	}
}
