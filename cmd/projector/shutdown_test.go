package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
)

// TestSIGTERMCommitsPlannedBatches sends SIGTERM to a projector process
// whose partition is far behind while its transaction waits on a lock:
// the process must commit what it had planned once the lock goes, well
// within --shutdown-timeout, and exit cleanly; the table then equals the
// reference fold of the log up to the stored offset.
func TestSIGTERMCommitsPlannedBatches(t *testing.T) {
	stopSignalCommitsPlannedBatches(t, syscall.SIGTERM)
}

// TestSIGHUPStopsAsSIGTERM: SIGHUP (a closed terminal, a reload habit)
// stops the member as SIGTERM does, committing its planned batches, and
// says so in one log line, rather than killing it on the spot.
func TestSIGHUPStopsAsSIGTERM(t *testing.T) {
	c := stopSignalCommitsPlannedBatches(t, syscall.SIGHUP)
	if n := strings.Count(c.stderr.String(), "SIGHUP received: stopping as for SIGTERM"); n != 1 {
		t.Errorf("the SIGHUP line logged %d times, want once\n%s", n, c.stderr)
	}
}

// stopSignalCommitsPlannedBatches runs the SIGTERM test with sig and
// returns the stopped process.
func stopSignalCommitsPlannedBatches(t *testing.T, sig syscall.Signal) *child {
	ctx := t.Context()
	db := testenv.NewDB(t)
	cluster := testenv.Kafka(t, demo.Topic, 1) // one partition: record i is at offset i
	reg, regClient := testenv.Registry(t)
	enc, err := demo.RegisterSchemas(ctx, regClient)
	if err != nil {
		t.Fatal(err)
	}
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 2000, 5
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
	config := filepath.Join(t.TempDir(), "projections.yaml")
	if err := os.WriteFile(config, demo.Projections, 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Main(ctx, []string{"migrate", "--database-url", db.URL, "--config", config}, &out, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, &out)
	}

	locker, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(t.Context())
	lock, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Reads go on (batches are planned), writes wait.
	if _, err := lock.Exec(ctx, `LOCK TABLE accounts IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}

	const shutdownTimeout = 20 * time.Second
	c := startChild(t, "run",
		"--brokers", cluster.ListenAddrs()[0],
		"--registry-url", reg.URL(),
		"--database-url", db.URL,
		"--identity", "sigterm",
		"--config", config,
		"--http-addr", "",
		"--batch-max-records", "100",
		"--commit-max-batches", "5",
		"--shutdown-timeout", shutdownTimeout.String(),
		"--log-level", "warn",
	)
	testenv.WaitFor(t, 30*time.Second, func() error {
		select {
		case err := <-c.done:
			t.Fatalf("projector exited early: %v\n%s", err, c.stderr)
		default:
		}
		var waiting int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'accounts'::regclass`).Scan(&waiting); err != nil {
			return err
		}
		if waiting == 0 {
			return errors.New("no transaction waits on the locked table yet")
		}
		return nil
	})
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-c.done:
		c.done <- nil // for the cleanup
		if err != nil {
			t.Fatalf("projector did not exit cleanly on %v: %v\n%s", sig, err, c.stderr)
		}
	case <-time.After(2 * shutdownTimeout):
		t.Fatalf("projector still running %v after %v\n%s", 2*shutdownTimeout, sig, c.stderr)
	}
	if took := time.Since(began); took >= shutdownTimeout {
		t.Errorf("exit took %v, the whole --shutdown-timeout: the planned batches were abandoned\n%s", took, c.stderr)
	}

	var stored int64
	if err := db.Pool.QueryRow(ctx, `SELECT coalesce(next_offset, 0) FROM projector_offsets WHERE identity = 'sigterm' AND topic = $1 AND partition = 0`, demo.Topic).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	// The transaction that waited on the lock held at least one planned
	// batch.
	if stored == 0 || stored >= end[0] {
		t.Fatalf("stored offset %d of %d after SIGTERM: want the batches planned before it, and the partition still behind\n%s", stored, end[0], c.stderr)
	}
	exp := demo.Fold(records[:stored])
	if err := demo.Verify(ctx, db.Pool, demo.Table, exp); err != nil {
		t.Fatalf("table after SIGTERM at offset %d: %v", stored, err)
	}
	var parked, dead int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM projector_parked), (SELECT count(*) FROM projector_dead_letters)`).Scan(&parked, &dead); err != nil {
		t.Fatal(err)
	}
	if parked != exp.Parked || dead != exp.Poison {
		t.Errorf("after SIGTERM: %d parked events, %d dead letters; the fold up to offset %d has %d and %d", parked, dead, stored, exp.Parked, exp.Poison)
	}
	return c
}

// A shutdown timeout that leaves no time to commit is refused by name.
func TestShutdownTimeoutMustBePositive(t *testing.T) {
	for _, v := range []string{"0s", "-1s"} {
		var out bytes.Buffer
		err := Main(t.Context(), []string{"run", "--brokers", "b", "--registry-url", "http://r", "--shutdown-timeout", v}, &out, &out)
		if err == nil || !strings.Contains(err.Error(), "--shutdown-timeout") {
			t.Errorf("--shutdown-timeout %s: got error %v, want one naming the flag", v, err)
		}
	}
}
