package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
)

// stopped reports whether the process is stopped by a signal.
func (p *child) stopped() bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	i := strings.LastIndexByte(string(stat), ')')
	return i > 0 && i+2 < len(stat) && (stat[i+2] == 'T' || stat[i+2] == 't')
}

// TestFrozenOwnerDoesNotBlockTheNewOwner: a member frozen (SIGSTOP) in
// the middle of its batch transaction, after it updated the partition's
// offset row, holds that row's lock. With the default session timeouts
// PostgreSQL ends its session once it has been idle in the transaction
// for --database-idle-in-transaction-timeout, so the member the group
// gives the partition to claims it and projects the rest of the stream
// within a bound: the table equals the reference fold.
func TestFrozenOwnerDoesNotBlockTheNewOwner(t *testing.T) {
	ctx := t.Context()
	e := newRunEnv(t, 1, 0)
	opts := demo.DefaultOptions()
	// Few poison pills: each is retried for a second before it is
	// dead-lettered, which would blur the time taken to take over.
	opts.Aggregates, opts.Seed, opts.Poison = 600, 5, 2
	records := demo.Generate(opts)
	half := len(records) / 2
	e.produce(t, records[:half])

	// The owner is held still at the right moment by a trigger that, once
	// armed, makes the offset row's update wait for an advisory lock the
	// test holds: the update is done, and the row locked, once the test
	// lets go of it.
	var out strings.Builder
	if err := Main(ctx, []string{"migrate", "--database-url", e.db.URL, "--config", e.config}, &out, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, &out)
	}
	key := rand.Int64()
	if _, err := e.db.Pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE freeze_gate (armed bool NOT NULL);
		INSERT INTO freeze_gate VALUES (false);
		CREATE FUNCTION freeze_on_advance() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT armed FROM freeze_gate) THEN PERFORM pg_advisory_xact_lock(%d); END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER freeze_on_advance AFTER UPDATE ON projector_offsets FOR EACH ROW
			WHEN (NEW.next_offset IS DISTINCT FROM OLD.next_offset) EXECUTE FUNCTION freeze_on_advance()`, key)); err != nil {
		t.Fatal(err)
	}

	app := fmt.Sprintf("frozen-%x", rand.Uint32())
	u, err := url.Parse(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	args := e.args("frozen", "--database-url", u.String())

	owner := startChild(t, args...)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, e.db.Pool, "frozen", demo.Topic, e.end, nil); err != nil {
		t.Fatalf("%v\nowner's stderr:\n%s", err, owner.stderr)
	}

	holder, err := pgx.Connect(ctx, e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(t.Context())
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Pool.Exec(ctx, `UPDATE freeze_gate SET armed = true`); err != nil {
		t.Fatal(err)
	}
	e.produce(t, records[half:])
	var pid int32
	testenv.WaitFor(t, 30*time.Second, func() error {
		return e.db.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock' AND wait_event = 'advisory'`, app).Scan(&pid)
	})
	if err := owner.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, func() error {
		if !owner.stopped() {
			return fmt.Errorf("process %d not stopped yet", owner.cmd.Process.Pid)
		}
		return nil
	})
	frozen := time.Now()
	if _, err := e.db.Pool.Exec(ctx, `UPDATE freeze_gate SET armed = false`); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
		t.Fatal(err)
	}
	// The frozen owner's session now holds the offset row, idle in its
	// transaction, waiting for a COMMIT that will not come.
	testenv.WaitFor(t, 10*time.Second, func() error {
		var state string
		if err := e.db.Pool.QueryRow(ctx, `SELECT state FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&state); err != nil {
			return err
		}
		if state != "idle in transaction" {
			return fmt.Errorf("frozen owner's session is %q", state)
		}
		return nil
	})

	successor := startChild(t, args...)
	// The default --database-idle-in-transaction-timeout, then the group
	// noticing the frozen member (--session-timeout), and room for a slow machine.
	bound := 15*time.Second + 6*time.Second + 20*time.Second
	wctx, cancel = context.WithTimeout(ctx, bound)
	defer cancel()
	if err := demo.WaitCommitted(wctx, e.db.Pool, "frozen", demo.Topic, e.end, nil); err != nil {
		var locks []string
		rows, _ := e.db.Pool.Query(ctx, `SELECT format('%s pid %s: %s', application_name, pid, state) FROM pg_stat_activity WHERE application_name = $1`, app)
		for rows.Next() {
			var l string
			_ = rows.Scan(&l)
			locks = append(locks, l)
		}
		rows.Close()
		t.Fatalf("the new owner did not take over the partition within %v of the old one freezing: %v\nsessions: %v\nnew owner's stderr:\n%s",
			bound, err, locks, successor.stderr)
	}
	t.Logf("the new owner finished the stream %v after the old one froze", time.Since(frozen).Round(time.Millisecond))
	if err := demo.Verify(ctx, e.db.Pool, demo.Table, demo.Fold(e.records)); err != nil {
		t.Fatal(err)
	}
	var alive bool
	if err := e.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive); err != nil {
		t.Fatal(err)
	}
	if alive {
		t.Errorf("the frozen owner's session %d is still there", pid)
	}
}
