package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/rebuild"
)

// committed is how many records identity has committed on the stream.
func (rs *rebuildStream) committed(t *testing.T, identity string) int64 {
	t.Helper()
	end, err := demo.EndOffsets(t.Context(), rs.adm, rs.topic)
	if err != nil {
		t.Fatal(err)
	}
	n, _, err := demo.Committed(t.Context(), rs.db.Pool, identity, rs.topic, end)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// gone says what is left of a dropped generation: its table, its stored
// offsets or its consumer group.
func (rs *rebuildStream) gone(table, group string) error {
	ctx := context.Background()
	var exists bool
	var offsets int
	if err := rs.db.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL,
		(SELECT count(*) FROM projector_offsets WHERE identity = $2)`, table, group).Scan(&exists, &offsets); err != nil {
		return err
	}
	groups, err := rs.adm.ListGroups(ctx)
	if err != nil {
		return err
	}
	if listed := slices.Contains(groups.Groups(), group); exists || offsets > 0 || listed {
		return fmt.Errorf("table %s left %t, %d stored offsets of %s, its consumer group listed %t", table, exists, offsets, group, listed)
	}
	return nil
}

func (rs *rebuildStream) start(t *testing.T, r rebuild.Request) rebuild.Operation {
	t.Helper()
	r.Identity, r.Projection = rs.identity, "accounts"
	op, err := rebuild.NewStore(rs.db.Pool).Start(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	return op
}

func stopChildren(t *testing.T, cs ...*child) {
	t.Helper()
	for _, c := range cs {
		if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := <-c.done; err != nil {
			t.Errorf("projector did not stop cleanly: %v\n%s", err, tail(c.stderr.String(), 4000))
		}
		c.done <- nil
	}
}

// TestRebuildSurvivesKillOfEveryReplica kills one replica with SIGKILL in
// the middle of a rebuild (the other carries on), then the other: started
// again, they resume the new generation from its stored offsets, not from
// the start, and the rebuilt table equals the reference fold.
func TestRebuildSurvivesKillOfEveryReplica(t *testing.T) {
	// Waits on processes and timeouts more than it computes: run beside
	// the other long tests of its kind.
	t.Parallel()
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 3000, 12
	rs := newRebuildStream(t, opts, 4, "--rebuild-rate", "1500")
	rs.produce(t, rs.records)
	a, b := startChild(t, rs.args...), startChild(t, rs.args...)
	rs.caughtUp(t, rs.identity, a, b)
	def := definitionOf(t, rs.newFile, "accounts")
	op := rs.start(t, rebuild.Request{Definition: &def})
	group := rebuild.GroupID(rs.identity, "accounts", 2)
	total := int64(len(rs.records))
	testenv.WaitFor(t, time.Minute, func() error {
		if n := rs.committed(t, group); n < total/5 {
			return fmt.Errorf("generation 2 committed %d of %d records", n, total)
		}
		return nil
	})
	// One replica dying leaves the other to carry on.
	a.kill(t)
	alone := rs.committed(t, group)
	testenv.WaitFor(t, time.Minute, func() error {
		if n := rs.committed(t, group); n <= alone {
			return fmt.Errorf("generation 2 has not moved on from %d with one replica left\n%s", n, tail(b.stderr.String(), 3000))
		}
		return nil
	})
	b.kill(t)
	before := rs.committed(t, group)
	if before >= total {
		t.Fatalf("generation 2 finished before the kill; the test did not kill mid-rebuild")
	}
	t.Logf("killed both replicas with generation 2 at %d of %d records", before, total)
	// Restarted once the group has let the killed members go (their
	// session timeout), as a restarted fleet finds it.
	testenv.WaitFor(t, time.Minute, func() error {
		groups, err := rs.adm.DescribeGroups(t.Context(), group, rs.identity)
		if err != nil {
			return err
		}
		for _, g := range groups {
			if len(g.Members) > 0 {
				return fmt.Errorf("group %s still has %d members", g.Group, len(g.Members))
			}
		}
		return nil
	})

	a, b = startChild(t, slices.Replace(slices.Clone(rs.args), slices.Index(rs.args, "1500"), slices.Index(rs.args, "1500")+1, "0")...), startChild(t, rs.args...)
	// From its stored offsets: never below where it was killed.
	testenv.WaitFor(t, time.Minute, func() error {
		n := rs.committed(t, group)
		if n < before {
			t.Fatalf("generation 2 went back from %d to %d committed records: it started over", before, n)
		}
		if n == before {
			return fmt.Errorf("generation 2 has not moved on from %d\n%s\n%s", before, tail(a.stderr.String(), 3000), tail(b.stderr.String(), 3000))
		}
		return nil
	})
	rs.waitOperation(t, op.ID, 2*time.Minute, rebuild.StateCompleted, a, b)
	rs.caughtUp(t, group, a, b)
	if err := verifyDeposits(t.Context(), rs.db.Pool, demo.Table, demo.Fold(rs.records)); err != nil {
		t.Errorf("the rebuilt projection: %v", err)
	}
	stopChildren(t, a, b)
}

// TestRebuildCancelThenRollback cancels a running rebuild (its table,
// offsets and consumer group go, the live generation is untouched), then
// rebuilds to completion and rolls back: generation 1 resumes from its own
// offsets, catches up with records produced meanwhile and is live again.
func TestRebuildCancelThenRollback(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 1500, 13
	rs := newRebuildStream(t, opts, 2, "--rebuild-rate", "300")
	half := len(rs.records) / 2
	rs.produce(t, rs.records[:half])
	a := startChild(t, rs.args...)
	rs.caughtUp(t, rs.identity, a)
	store := rebuild.NewStore(rs.db.Pool)

	def := definitionOf(t, rs.newFile, "accounts")
	op := rs.start(t, rebuild.Request{Definition: &def})
	rs.waitOperation(t, op.ID, time.Minute, rebuild.StateRunning, a)
	group := rebuild.GroupID(rs.identity, "accounts", 2)
	testenv.WaitFor(t, time.Minute, func() error {
		if rs.committed(t, group) == 0 {
			return errors.New("generation 2 has committed nothing yet")
		}
		return nil
	})
	if _, err := store.Cancel(ctx, op.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Cancel(ctx, op.ID, "test"); err == nil {
		t.Error("a second cancel succeeded")
	}
	testenv.WaitFor(t, time.Minute, func() error {
		if err := rs.gone("accounts__g2", group); err != nil {
			return fmt.Errorf("after the cancel: %w\n%s", err, tail(a.stderr.String(), 3000))
		}
		return nil
	})
	exp := demo.Fold(rs.records[:half])
	if err := demo.Verify(ctx, rs.db.Pool, demo.Table, exp); err != nil {
		t.Errorf("the live generation after the cancel: %v", err)
	}

	// A rebuild to completion (generation 3: 2 was cancelled), unthrottled.
	stopChildren(t, a)
	fast := slices.Clone(rs.args)
	fast[slices.Index(fast, "300")] = "0"
	a = startChild(t, fast...)
	op = rs.start(t, rebuild.Request{Definition: &def})
	if op.Generation != 3 {
		t.Errorf("the rebuild after a cancelled one builds generation %d, want 3", op.Generation)
	}
	rs.waitOperation(t, op.ID, 2*time.Minute, rebuild.StateCompleted, a)
	rs.produce(t, rs.records[half:])
	rs.caughtUp(t, rebuild.GroupID(rs.identity, "accounts", 3), a)
	exp = demo.Fold(rs.records)
	if err := verifyDeposits(ctx, rs.db.Pool, demo.Table, exp); err != nil {
		t.Errorf("generation 3: %v", err)
	}

	back, err := store.Rollback(ctx, rs.identity, "accounts", "test")
	if err != nil {
		t.Fatal(err)
	}
	if back.Generation != 1 {
		t.Errorf("the rollback brings back generation %d, want 1", back.Generation)
	}
	rs.waitOperation(t, back.ID, 2*time.Minute, rebuild.StateCompleted, a)
	rs.caughtUp(t, rebuild.GroupID(rs.identity, "accounts", 1), a)
	if err := demo.Verify(ctx, rs.db.Pool, demo.Table, exp); err != nil {
		t.Errorf("generation 1, live again: %v", err)
	}
	// The retired generation 3, dropped at once: its table, offsets and
	// consumer group go.
	var out strings.Builder
	if err := Main(ctx, []string{"rebuild", "cleanup", "--projection", "accounts", "--execute", "--identity", rs.identity,
		"--database-url", rs.db.URL, "--brokers", rs.cluster.Brokers()}, &out, &out); err != nil {
		t.Fatalf("rebuild cleanup: %v\n%s", err, out.String())
	}
	if err := rs.gone("accounts__g3_retired", rebuild.GroupID(rs.identity, "accounts", 3)); err != nil {
		t.Errorf("after cleanup: %v\n%s", err, out.String())
	}
	var hasDeposits bool
	if err := rs.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_name = 'accounts' AND column_name = 'deposits' AND table_schema = current_schema())`).Scan(&hasDeposits); err != nil || hasDeposits {
		t.Errorf("accounts after the rollback has generation 3's deposits column (%v)", err)
	}
	stopChildren(t, a)
}

// TestRebuildRefusesTruncatedHistory fails a rebuild whose topic lost its
// first records to retention, with the partitions and counts, unless the
// caller accepts a partial history.
func TestRebuildRefusesTruncatedHistory(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 300, 14
	rs := newRebuildStream(t, opts, 2)
	rs.produce(t, rs.records)
	a := startChild(t, rs.args...)
	rs.caughtUp(t, rs.identity, a)
	rs.cluster.DeleteRecords(rs.topic, 1, 10)

	op := rs.start(t, rebuild.Request{})
	store := rebuild.NewStore(rs.db.Pool)
	var got rebuild.Operation
	testenv.WaitFor(t, time.Minute, func() error {
		var err error
		if got, _, err = store.Operation(ctx, op.ID); err != nil {
			return err
		}
		if !got.Done() {
			return fmt.Errorf("operation %s", got.State)
		}
		return nil
	})
	if got.State != rebuild.StateFailed || got.Error == nil || got.Error.Code != rebuild.CodeHistoryDeleted ||
		!strings.Contains(got.Error.Message, "1 (10 records)") || !strings.Contains(got.Error.Message, "--allow-partial-history") {
		t.Fatalf("rebuild of a truncated topic: %s %+v, want failed with %s naming partition 1 and its 10 records", got.State, got.Error, rebuild.CodeHistoryDeleted)
	}
	op = rs.start(t, rebuild.Request{AllowPartialHistory: true})
	got = rs.waitOperation(t, op.ID, 2*time.Minute, rebuild.StateCompleted, a)
	if !got.AllowPartialHistory || len(got.DeletedRecords) != 1 || got.DeletedRecords[0].Records != 10 {
		t.Errorf("the accepted partial history is not recorded: %+v", got)
	}
	stopChildren(t, a)
}

// TestAutoRebuildFromTwoReplicas starts two replicas at once with a file
// that defines the projection otherwise than its live generation and
// --auto-rebuild: exactly one rebuild starts, and it completes.
func TestAutoRebuildFromTwoReplicas(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 500, 15
	rs := newRebuildStream(t, opts, 2)
	rs.produce(t, rs.records)
	a := startChild(t, rs.args...)
	rs.caughtUp(t, rs.identity, a)
	stopChildren(t, a)

	// Without --auto-rebuild: the live generation serves, and the log
	// gives the command.
	changed := slices.Clone(rs.args)
	changed[slices.Index(changed, rs.config)] = rs.newFile
	a = startChild(t, changed...)
	testenv.WaitFor(t, time.Minute, testenv.Holds("the log gives the rebuild command", func() bool {
		return strings.Contains(a.stderr.String(), "projector rebuild start --projection accounts --config "+rs.newFile)
	}))
	stopChildren(t, a)

	auto := append(changed, "--auto-rebuild")
	var wg sync.WaitGroup
	var cs [2]*child
	for i := range cs {
		wg.Go(func() { cs[i] = startChild(t, auto...) })
	}
	wg.Wait()
	store := rebuild.NewStore(rs.db.Pool)
	var ops []rebuild.Operation
	testenv.WaitFor(t, time.Minute, func() error {
		var err error
		if ops, err = store.Operations(ctx, rs.identity, false); err != nil {
			return err
		}
		if len(ops) == 0 {
			return errors.New("no operation yet")
		}
		return nil
	})
	rs.waitOperation(t, ops[0].ID, 2*time.Minute, rebuild.StateCompleted, cs[0], cs[1])
	if ops, _ = store.Operations(ctx, rs.identity, false); len(ops) != 1 {
		t.Errorf("%d operations started by two replicas with --auto-rebuild, want 1", len(ops))
	}
	rs.caughtUp(t, rebuild.GroupID(rs.identity, "accounts", 2), cs[0], cs[1])
	if err := verifyDeposits(ctx, rs.db.Pool, demo.Table, demo.Fold(rs.records)); err != nil {
		t.Errorf("auto-rebuilt projection: %v", err)
	}
	stopChildren(t, cs[0], cs[1])
}

// TestAdminAPIThroughRun starts, reads and cancels a rebuild over the
// admin API of a running replica (--api, with --auth none every request
// has the admin scope): 202 with the operation's
// Location, 409 naming it for a second start, its state as it runs, and
// the cancel.
func TestAdminAPIThroughRun(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 300, 16
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rs := newRebuildStream(t, opts, 2, "--api", "--auth", "none", "--api-addr", addr, "--rebuild-rate", "100")
	rs.produce(t, rs.records)
	a := startChild(t, rs.args...)
	rs.caughtUp(t, rs.identity, a)
	base := "http://" + addr

	do := func(method, path string, body string) (int, http.Header, map[string]any) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatalf("%s %s: %d, not JSON: %v", method, path, resp.StatusCode, err)
		}
		return resp.StatusCode, resp.Header, out
	}
	code, h, op := do("POST", "/admin/v1/projections/accounts/rebuilds", "")
	if code != http.StatusAccepted || op["state"] != "accepted" || h.Get("Location") != "/admin/v1/operations/"+op["operation_id"].(string) {
		t.Fatalf("start: %d %v Location %q", code, op, h.Get("Location"))
	}
	id := op["operation_id"].(string)
	code, _, body := do("POST", "/admin/v1/projections/accounts/rebuilds", "")
	if code != http.StatusConflict || !strings.Contains(fmt.Sprint(body), id) {
		t.Errorf("a second start: %d %v, want 409 naming %s", code, body, id)
	}
	testenv.WaitFor(t, time.Minute, func() error {
		code, _, op := do("GET", "/admin/v1/operations/"+id, "")
		if code != http.StatusOK || op["state"] != "running" || op["records_remaining"] == nil {
			return fmt.Errorf("operation: %d %v, want running with its progress", code, op)
		}
		return nil
	})
	code, _, op = do("DELETE", "/admin/v1/operations/"+id, "")
	if code != http.StatusOK || op["state"] != "cancelled" {
		t.Errorf("cancel: %d %v", code, op)
	}
	stopChildren(t, a)
}

// TestRebuildOneOfTwoProjectionsOfATopic rebuilds the fold projection of
// a topic that also feeds a snapshot projection, under live traffic: the
// deployment's engine, which ran both as lanes of one worker, goes on with
// the snapshot alone after the cutover, and both tables equal their
// reference folds, each projection's dead letters and parked events held
// once.
func TestRebuildOneOfTwoProjectionsOfATopic(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed, opts.TombstoneEvery = 1500, 17, 4
	_, snapshot, ok := strings.Cut(string(demo.SnapshotProjections), "projections:\n")
	if !ok {
		t.Fatal("test bug: the snapshot file has no projections list")
	}
	rs := newRebuildStream(t, opts, 3)
	for _, path := range []string{rs.config, rs.newFile} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, strings.ReplaceAll(snapshot, "topic: "+demo.Topic, "topic: "+rs.topic)...)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	half := len(rs.records) / 2
	rs.produce(t, rs.records[:half])
	a, b := startChild(t, rs.args...), startChild(t, rs.args...)
	rs.caughtUp(t, rs.identity, a, b)
	def := definitionOf(t, rs.newFile, "accounts")
	op := rs.start(t, rebuild.Request{Definition: &def})
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		rest := rs.records[half:]
		for len(rest) > 0 && ctx.Err() == nil {
			n := min(len(rest), 300)
			if err := demo.Produce(ctx, rs.prod, rs.enc, rest[:n], nil); err != nil {
				t.Error(err)
				return
			}
			rest = rest[n:]
			time.Sleep(20 * time.Millisecond) // a steady trickle, not a test wait
		}
	}()
	rs.waitOperation(t, op.ID, 3*time.Minute, rebuild.StateCompleted, a, b)
	<-produced
	rs.caughtUp(t, rebuild.GroupID(rs.identity, "accounts", 2), a, b)
	rs.caughtUp(t, rs.identity, a, b)

	exp := demo.Fold(rs.records)
	if err := verifyDeposits(ctx, rs.db.Pool, demo.Table, exp); err != nil {
		t.Errorf("the rebuilt fold projection: %v", err)
	}
	if err := demo.VerifySnapshots(ctx, rs.db.Pool, exp); err != nil {
		t.Errorf("the snapshot projection, which stayed at generation 1: %v", err)
	}
	for _, c := range []struct{ identity, projection string }{
		{rebuild.GroupID(rs.identity, "accounts", 2), "accounts"},
		{rs.identity, demo.SnapshotTable},
	} {
		var dead, parked int
		if err := rs.db.Pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM projector_dead_letters WHERE identity = $1 AND projection = $2),
			(SELECT count(*) FROM projector_parked WHERE identity = $1 AND projection = $2)`, c.identity, c.projection).Scan(&dead, &parked); err != nil {
			t.Fatal(err)
		}
		if dead != exp.Poison || parked != exp.Parked {
			t.Errorf("%s of %s: %d dead letters and %d parked events, want %d and %d", c.projection, c.identity, dead, parked, exp.Poison, exp.Parked)
		}
	}
	stopChildren(t, a, b)
}

// TestRebuildDoesNotRepublishDeadLetters rebuilds a projection whose
// replica publishes dead letters to a topic: the rebuild dead-letters the
// history's poison records again, under its own identity, but the topic
// keeps one copy of each.
func TestRebuildDoesNotRepublishDeadLetters(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 500, 18
	// A name of the test's own: tests sharing a real cluster never meet.
	dlq := fmt.Sprintf("dead.%x", time.Now().UnixNano())
	rs := newRebuildStream(t, opts, 2, "--dlq-topic", dlq)
	rs.cluster.CreateTopic(dlq, 1, nil)
	rs.produce(t, rs.records)
	exp := demo.Fold(rs.records)
	if exp.Poison == 0 {
		t.Fatal("test bug: the stream has no poison records")
	}
	a := startChild(t, rs.args...)
	rs.caughtUp(t, rs.identity, a)
	published := func() (int64, error) {
		ends, err := rs.adm.ListEndOffsets(ctx, dlq)
		if err != nil {
			return 0, err
		}
		o, _ := ends.Lookup(dlq, 0)
		return o.Offset, o.Err
	}
	settled := func() error {
		var queued int
		if err := rs.db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_dlq_outbox`).Scan(&queued); err != nil {
			return err
		}
		n, err := published()
		if err != nil {
			return err
		}
		if queued > 0 || n < int64(exp.Poison) {
			return fmt.Errorf("%d dead letters queued, %d published of %d", queued, n, exp.Poison)
		}
		return nil
	}
	testenv.WaitFor(t, time.Minute, settled)
	def := definitionOf(t, rs.newFile, "accounts")
	op := rs.start(t, rebuild.Request{Definition: &def})
	rs.waitOperation(t, op.ID, 2*time.Minute, rebuild.StateCompleted, a)
	group := rebuild.GroupID(rs.identity, "accounts", 2)
	rs.caughtUp(t, group, a)
	testenv.WaitFor(t, time.Minute, settled)
	var dead int
	if err := rs.db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_dead_letters WHERE identity = $1`, group).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	n, err := published()
	if err != nil {
		t.Fatal(err)
	}
	if dead != exp.Poison || n != int64(exp.Poison) {
		t.Errorf("generation 2 holds %d dead letters (want %d) and the topic %d (want %d: one copy of each)", dead, exp.Poison, n, exp.Poison)
	}
	stopChildren(t, a)
}
