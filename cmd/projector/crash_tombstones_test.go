package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
)

// TestCrashRecoveryWithTombstones kills a projector process with SIGKILL
// mid-stream, twice, while the stream deletes accounts with tombstones and
// re-sends older versions after them; a restarted process has neither its
// state cache nor its tombstone filter. The final table equals the
// reference fold in fold and in snapshot mode: no deleted row comes back.
func TestCrashRecoveryWithTombstones(t *testing.T) {
	for _, mode := range []string{"fold", "snapshot"} {
		t.Run(mode, func(t *testing.T) {
			ctx := t.Context()
			db := testenv.NewDB(t)
			cluster := testenv.Kafka(t, demo.Topic, 3)
			reg, regClient := testenv.Registry(t)
			enc, err := demo.RegisterSchemas(ctx, regClient)
			if err != nil {
				t.Fatal(err)
			}
			opts := demo.DefaultOptions()
			opts.Aggregates, opts.Seed, opts.TombstoneEvery = 1500, 11, 3
			records := demo.Generate(opts)
			prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
			if err != nil {
				t.Fatal(err)
			}
			defer prod.Close()
			if err := demo.Produce(ctx, prod, enc, records, nil); err != nil {
				t.Fatal(err)
			}
			end, err := demo.EndOffsets(ctx, kadm.NewClient(prod), demo.Topic)
			if err != nil {
				t.Fatal(err)
			}
			file := demo.Projections
			if mode == "snapshot" {
				file = demo.SnapshotProjections
			}
			config := filepath.Join(t.TempDir(), "projections.yaml")
			if err := os.WriteFile(config, file, 0o600); err != nil {
				t.Fatal(err)
			}
			args := []string{"run",
				"--brokers", cluster.ListenAddrs()[0],
				"--registry-url", reg.URL(),
				"--database-url", db.URL,
				"--identity", "crash",
				"--config", config,
				"--http-addr", "",
				"--batch-max-records", "50",
				"--log-level", "warn",
				"--session-timeout", "6s", // the group notices a killed member sooner
			}
			var out bytes.Buffer
			if err := Main(ctx, []string{"migrate", "--database-url", db.URL, "--config", config}, &out, &out); err != nil {
				t.Fatalf("migrate: %v\n%s", err, &out)
			}

			crashAndFinish(t, db, args, "crash", end, int64(len(records)), 2)

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
