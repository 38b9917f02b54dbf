package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestStatusShowsOrphanedPartition: a running member's partition is
// claimed by a newer owner outside its group, which then applies
// nothing. projector status, which reads the database and the brokers,
// must not say ok: it shows the partition orphaned (or stalled, once its
// records have waited --stall-after) with the reason and the member, in
// the table and in --json. Once the member has claimed the partition back
// and applied its records, status says ok again and the table equals the
// reference fold.
func TestStatusShowsOrphanedPartition(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	cluster := testenv.Kafka(t, demo.Topic, 1)
	reg, regClient := testenv.Registry(t)
	enc, err := demo.RegisterSchemas(ctx, regClient)
	if err != nil {
		t.Fatal(err)
	}
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 200, 11
	records := demo.Generate(opts)
	half := len(records) / 2
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produce := func(rs []demo.Record) map[int32]int64 {
		t.Helper()
		if err := demo.Produce(ctx, prod, enc, rs, nil); err != nil {
			t.Fatal(err)
		}
		end, err := demo.EndOffsets(ctx, kadm.NewClient(prod), demo.Topic)
		if err != nil {
			t.Fatal(err)
		}
		return end
	}
	end := produce(records[:half])
	config := filepath.Join(t.TempDir(), "projections.yaml")
	if err := os.WriteFile(config, demo.Projections, 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Main(ctx, []string{"migrate", "--database-url", db.URL, "--config", config}, &out, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, &out)
	}
	c := startChild(t, "run",
		"--brokers", cluster.ListenAddrs()[0],
		"--registry-url", reg.URL(),
		"--database-url", db.URL,
		"--identity", "orphan",
		"--config", config,
		"--http-addr", "",
		"--retry-cap", "200ms",
		"--stall-after", "2s",
		"--reclaim-after", "6s",
		"--log-level", "warn",
	)
	wait := func(end map[int32]int64) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := demo.WaitCommitted(wctx, db.Pool, "orphan", demo.Topic, end, nil); err != nil {
			t.Fatalf("%v\n%s", err, c.stderr)
		}
	}
	wait(end)

	status := func(args ...string) string {
		t.Helper()
		var out, errs bytes.Buffer
		if err := Main(ctx, append([]string{"status", "--brokers", cluster.ListenAddrs()[0], "--database-url", db.URL, "--identity", "orphan"}, args...), &out, &errs); err != nil {
			t.Fatalf("status: %v\n%s", err, &errs)
		}
		return out.String()
	}
	if _, err := postgres.NewOffsets(db.Pool, "orphan").Claim(ctx, []sinks.TP{{Topic: demo.Topic, Partition: 0}}); err != nil {
		t.Fatal(err)
	}
	end = produce(records[half:])
	testenv.WaitFor(t, 30*time.Second, func() error {
		var rows []struct {
			State, Reason, Member string
			Since                 *time.Time
		}
		if err := json.Unmarshal([]byte(status("--json")), &rows); err != nil {
			return err
		}
		if len(rows) != 1 || (rows[0].State != "orphaned" && rows[0].State != "stalled") ||
			!strings.Contains(rows[0].Reason, "newer owner") || rows[0].Member == "" || rows[0].Since == nil {
			return fmt.Errorf("status --json = %+v, want the partition orphaned or stalled, with the reason naming the newer owner and the member", rows)
		}
		table := status()
		if !strings.Contains(table, "newer owner") || strings.Contains(table, " ok\n") {
			return fmt.Errorf("status shows no orphan:\n%s", table)
		}
		return nil
	})

	// Claimed back: its records apply, and status says ok again.
	wait(end)
	if err := demo.Verify(ctx, db.Pool, demo.Table, demo.Fold(records)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		if table := status(); !strings.Contains(table, " ok\n") || strings.Contains(table, "newer owner") {
			return errors.New("status after the partition was claimed back:\n" + table)
		}
		return nil
	})
}
