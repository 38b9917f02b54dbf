package main

import (
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/projector"
)

// TestCrashRecoverySharedTopic kills a projector process with SIGKILL
// mid-stream, several times, while one topic feeds two projections (the
// demo's fold and a snapshot of the same events, with tombstones). Both
// tables are committed with the partition's one stored offset, so after
// the restarts each equals the reference fold, nothing applied twice, and
// each projection holds its parked events and dead letters once; status
// lists each partition once.
func TestCrashRecoverySharedTopic(t *testing.T) {
	// Waits on processes and timeouts more than it computes: run beside
	// the other long tests of its kind.
	t.Parallel()
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed, opts.TombstoneEvery = 2000, 5, 4
	// The demo's file with the snapshot projection as a second entry.
	_, snapshot, ok := strings.Cut(string(demo.SnapshotProjections), "projections:\n")
	if !ok {
		t.Fatal("test bug: the snapshot file has no projections list")
	}
	c := newCrashStream(t, 4, opts, append(append([]byte{}, demo.Projections...), snapshot...), "100", projector.GroupProtocolClassic)
	db, records := c.db, c.records
	c.crashAndFinish(t, 3)

	c.statusCaughtUp(t)

	exp := demo.Fold(records)
	if err := demo.Verify(ctx, db.Pool, demo.Table, exp); err != nil {
		t.Errorf("fold projection: %v", err)
	}
	if err := demo.VerifySnapshots(ctx, db.Pool, exp); err != nil {
		t.Errorf("snapshot projection: %v", err)
	}
	for _, name := range []string{"accounts", demo.SnapshotTable} {
		var parked, dead, deadRows int
		err := db.Pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM projector_parked WHERE projection = $1),
			(SELECT count(DISTINCT (partition, "offset")) FROM projector_dead_letters WHERE projection = $1),
			(SELECT count(*) FROM projector_dead_letters WHERE projection = $1)`, name).Scan(&parked, &dead, &deadRows)
		if err != nil {
			t.Fatal(err)
		}
		if parked != exp.Parked {
			t.Errorf("projection %s: parked events: got %d, want %d", name, parked, exp.Parked)
		}
		if dead != exp.Poison || deadRows != exp.Poison {
			t.Errorf("projection %s: dead letters: %d distinct offsets in %d rows; want %d, each once", name, dead, deadRows, exp.Poison)
		}
	}
}
