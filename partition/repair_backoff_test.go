package partition

import (
	"testing"
	"time"
)

// TestRepairBackoffLongOutage: a repair source down for a long time, with
// a large --retry-base, keeps the next try of a parked aggregate within
// --retry-cap however many attempts found it down.
func TestRepairBackoffLongOutage(t *testing.T) {
	const base, ceiling = time.Minute, 5 * time.Minute
	g := &gaps{aggs: map[string]*gap{"order-1": {count: 1, since: time.Now()}}}
	for n := 1; n <= 40; n++ {
		before := time.Now()
		if got := g.unavailable("order-1", base, ceiling); got != n {
			t.Fatalf("outage %d: unavailable returned %d", n, got)
		}
		if wait := g.aggs["order-1"].nextTry.Sub(before); wait < 0 || wait > ceiling+time.Second {
			t.Fatalf("outage %d: next try in %v, want within [0, %v]", n, wait, ceiling)
		}
	}
	for n := 1; n <= 40; n++ {
		before := time.Now()
		if got := g.failed("order-1", base, ceiling); got != n {
			t.Fatalf("failure %d: failed returned %d", n, got)
		}
		if wait := g.aggs["order-1"].nextTry.Sub(before); wait < 0 || wait > ceiling+time.Second {
			t.Fatalf("failure %d: next try in %v, want within [0, %v]", n, wait, ceiling)
		}
	}
}
