package postgres

import (
	"maps"
	"slices"
	"testing"
)

// splitNew reads every missed key that is not new and assumes the missed
// new ones, whether the lists come in the order of the batch's keys (one
// pass) or not (by a set).
func TestSplitNew(t *testing.T) {
	all := []string{"a", "b", "c", "d", "e", "f"}
	misses := []string{"a", "c", "d", "f"} // b and e are cached
	newKeys := []string{"b", "c", "f"}     // b is new but cached
	wantRead, wantAssumed := []string{"a", "d"}, map[string]bool{"c": true, "f": true}
	for _, tc := range []struct {
		name            string
		all, misses, nk []string
	}{
		{"in order", all, misses, newKeys},
		{"new keys out of order", all, misses, []string{"f", "b", "c"}},
		{"misses out of order", all, []string{"d", "a", "f", "c"}, newKeys},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read, assumed := splitNew(tc.all, tc.misses, tc.nk, true)
			slices.Sort(read)
			if !slices.Equal(read, wantRead) || !maps.Equal(assumed, wantAssumed) {
				t.Errorf("read %v, assumed %v; want %v and %v", read, assumed, wantRead, wantAssumed)
			}
			read, assumed = splitNew(tc.all, tc.misses, tc.nk, false)
			slices.Sort(read)
			if !slices.Equal(read, wantRead) || assumed != nil {
				t.Errorf("without the assumed set: read %v, assumed %v; want %v and none", read, assumed, wantRead)
			}
		})
	}
}
