package main

import (
	"testing"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/projector"
)

// TestCrashRecoveryWithTombstones kills a projector process with SIGKILL
// mid-stream, twice, while the stream deletes accounts with tombstones and
// re-sends older versions after them; a restarted process has neither its
// state cache nor its tombstone filter. The final table equals the
// reference fold in fold and in snapshot mode: no deleted row comes back.
func TestCrashRecoveryWithTombstones(t *testing.T) {
	// Waits on processes and timeouts more than it computes: run beside
	// the other long tests of its kind.
	t.Parallel()
	for _, mode := range []string{"fold", "snapshot"} {
		t.Run(mode, func(t *testing.T) {
			ctx := t.Context()
			opts := demo.DefaultOptions()
			opts.Aggregates, opts.Seed, opts.TombstoneEvery = 1500, 11, 3
			file := demo.Projections
			if mode == "snapshot" {
				file = demo.SnapshotProjections
			}
			c := newCrashStream(t, 3, opts, file, "50", projector.GroupProtocolClassic)
			db, records := c.db, c.records
			var err error

			c.crashAndFinish(t, 2)

			exp := demo.Fold(records)
			if mode == "fold" {
				err = demo.Verify(ctx, db.Pool, demo.Table, exp)
			} else {
				err = demo.VerifySnapshots(ctx, db.Pool, exp)
			}
			if err != nil {
				t.Fatal(err)
			}
			var parked, dead, invalid int
			if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM projector_parked),
				(SELECT count(*) FROM projector_dead_letters),
				(SELECT count(*) FROM projector_dead_letters WHERE error_class = 'invalid' AND record_key IS NULL AND value IS NULL)`).Scan(&parked, &dead, &invalid); err != nil {
				t.Fatal(err)
			}
			keyless := 0
			for _, r := range records {
				if r.Tombstone && r.Key == "" {
					keyless++
				}
			}
			if parked != exp.Parked {
				t.Errorf("parked events: got %d, want %d", parked, exp.Parked)
			}
			if dead != exp.Poison || invalid != keyless || keyless == 0 {
				t.Errorf("dead letters: %d, %d of them keyless tombstones (class invalid); want %d, %d of them keyless tombstones, each once", dead, invalid, exp.Poison, keyless)
			}
		})
	}
}
