package main

import (
	"os/user"
	"slices"
	"strings"
	"testing"

	"github.com/projector-dev/projector/deadletters"
)

// TestDLQRedrive: a dry run lists what it would queue and writes
// nothing; bad limits are refused naming --limit; --execute queues open
// dead letters (leaving others alone) for their partitions, marks them
// queued and audits the request with the actor, the operating-system user
// and the database session user, which dlq audit prints; nothing is
// published to the source topic.
func TestDLQRedrive(t *testing.T) {
	e := newDLQEnv(t)
	ctx := t.Context()
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	produced := e.produced()
	queueRows := func() int {
		t.Helper()
		var n int
		if err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_redrives`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	out := e.mustRun("dlq", "redrive", "--identity", "ident")
	if !strings.Contains(out, "dry run: would queue 3 dead letters") {
		t.Errorf("dry run output:\n%s", out)
	}
	for _, name := range []string{"good", "garbage", "ledger"} {
		if !strings.Contains(out, "\n"+e.id(name)+" ") {
			t.Errorf("dry run does not list %s (id %s):\n%s", name, e.id(name), out)
		}
	}
	if n, a := queueRows(), e.audit(); n != 0 || len(a) != 0 || dlqStatus(t, e.db.Pool, e.ids["good"]).Status != deadletters.StatusOpen {
		t.Fatalf("the dry run wrote: %d queued, audit %+v", n, a)
	}
	for _, limit := range []string{"0", "10001"} {
		if _, err := e.run("dlq", "redrive", "--limit", limit, "--execute"); err == nil || !strings.Contains(err.Error(), "--limit "+limit) {
			t.Errorf("redrive --limit %s: error %v, want one naming --limit", limit, err)
		}
	}
	if n := queueRows(); n != 0 {
		t.Fatalf("a refused redrive queued %d", n)
	}

	out = e.mustRun("dlq", "redrive", "--id", e.id("good")+","+e.id("resolved"), "--execute", "--actor", "bob")
	if !strings.Contains(out, "queued 1 of 1") || !strings.Contains(out, e.id("resolved")+" (resolved)") {
		t.Errorf("redrive output:\n%s", out)
	}
	if got := e.listIDs("--status", "queued"); !slices.Equal(got, []int64{e.ids["good"]}) {
		t.Errorf("dlq list --status queued: %v, want [%d]", got, e.ids["good"])
	}
	var topic string
	var part int32
	var by, osUser, dbUser string
	if err := e.db.Pool.QueryRow(ctx, `SELECT topic, partition, requested_by, os_user, db_user FROM projector_redrives WHERE dead_letter_id = $1`,
		e.ids["good"]).Scan(&topic, &part, &by, &osUser, &dbUser); err != nil {
		t.Fatal(err)
	}
	if topic != e.kafka.Topic || part != 2 || by != "bob" || osUser != me.Username || dbUser != "postgres" {
		t.Errorf("queue row: %s/%d by %q (os %q, db %q); want %s/2 by bob (%q, postgres)", topic, part, by, osUser, dbUser, e.kafka.Topic, me.Username)
	}
	a := e.audit()
	if len(a) != 1 || a[0].Action != deadletters.AuditRedrive || a[0].Actor != "bob" || a[0].OSUser != me.Username ||
		a[0].DBUser != "postgres" || !slices.Equal(a[0].EntryIDs, []int64{e.ids["good"]}) {
		t.Fatalf("audit after redrive = %+v", a)
	}
	// Queued already: a second request leaves it alone.
	if out := e.mustRun("dlq", "redrive", "--id", e.id("good"), "--execute"); !strings.Contains(out, "nothing to redrive") {
		t.Errorf("redrive of a queued dead letter:\n%s", out)
	}

	// Purges record the users too, and dlq audit prints them.
	e.mustRun("dlq", "purge", "--id", e.id("garbage"), "--yes", "--actor", "carol")
	if a := e.audit(); a[0].Action != deadletters.AuditPurge || a[0].OSUser != me.Username || a[0].DBUser != "postgres" {
		t.Errorf("purge audit = %+v, want os user %q and db user postgres", a[0], me.Username)
	}
	out = e.mustRun("dlq", "audit")
	if !strings.Contains(out, "OS USER") || !strings.Contains(out, "DB USER") || !strings.Contains(out, me.Username) || !strings.Contains(out, "postgres") {
		t.Errorf("dlq audit output:\n%s", out)
	}
	if got := e.produced(); got != produced {
		t.Errorf("the source topic grew from %d to %d records: a redrive publishes nothing", produced, got)
	}
}
