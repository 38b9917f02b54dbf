package postgres_test

import (
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestOffsetsResetAndAdopt moves stored offsets as an operator would: the
// reset fences the owner of the time, and only that owner, while no one
// claimed after the reset, may take the partition up again from the new
// offset. Fresh partitions get their first offsets in one statement,
// except those a newer owner claimed meanwhile.
func TestOffsetsResetAndAdopt(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	if err := postgres.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	offs := postgres.NewOffsets(db.Pool, "ident")
	tp0, tp1, tp2 := sinks.TP{Topic: "t", Partition: 0}, sinks.TP{Topic: "t", Partition: 1}, sinks.TP{Topic: "t", Partition: 2}
	first, err := offs.Claim(ctx, []sinks.TP{tp0, tp1, tp2})
	if err != nil {
		t.Fatal(err)
	}
	// tp2 is claimed by a newer owner before its first offset is stored.
	if _, err := offs.Claim(ctx, []sinks.TP{tp2}); err != nil {
		t.Fatal(err)
	}
	set, err := offs.InitAll(ctx, first, []int64{10, 20, 30})
	if err != nil {
		t.Fatal(err)
	}
	if len(set) != 2 || !contains(set, tp0) || !contains(set, tp1) {
		t.Errorf("InitAll set %v, want %v and %v but not the partition claimed again", set, tp0, tp1)
	}

	// Nothing to adopt before any reset: the owner is the newest.
	if _, ok, err := offs.Adopt(ctx, tp0, 1); ok || err != nil {
		t.Errorf("Adopt without a reset = %v, %v; want nothing to adopt", ok, err)
	}
	resets, err := offs.Reset(ctx, "alice", "--to-offset 5", map[sinks.TP]int64{tp0: 5, tp1: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(resets) != 2 || resets[0].TP != tp0 || ptr(resets[0].OldOffset) != 10 || resets[0].NewOffset != 5 || resets[0].Epoch != 2 ||
		resets[1].TP != tp1 || ptr(resets[1].OldOffset) != 20 {
		t.Errorf("Reset = %+v, want tp0 10→5 and tp1 20→5 at epoch 2", resets)
	}
	// The owner of the time (epoch 1) is fenced: its commits name an
	// epoch that is no longer the stored one.
	if list, err := offs.List(ctx); err != nil || list[0].TP != tp0 || list[0].Epoch != 2 || ptr(list[0].NextOffset) != 5 {
		t.Errorf("stored after the reset: %+v, %v; want tp0 at 5, epoch 2", list, err)
	}
	// It takes tp0 up again; tp1 was claimed by another member after the
	// reset, which the reset must not fence again.
	if _, err := offs.Claim(ctx, []sinks.TP{tp1}); err != nil {
		t.Fatal(err)
	}
	c, ok, err := offs.Adopt(ctx, tp0, 1)
	if err != nil || !ok || c.Epoch != 3 || ptr(c.NextOffset) != 5 {
		t.Errorf("Adopt after the reset = %+v (next %d), %v, %v; want epoch 3 from offset 5", c, ptr(c.NextOffset), ok, err)
	}
	if _, ok, err := offs.Adopt(ctx, tp1, 1); ok || err != nil {
		t.Errorf("Adopt of a partition claimed after the reset = %v, %v; want nothing to adopt", ok, err)
	}
	if _, ok, _ := offs.Adopt(ctx, tp0, 1); ok {
		t.Error("the same reset was adopted twice")
	}
	audit, err := offs.ListResets(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(audit) != 2 || audit[0].Actor != "alice" || audit[0].Detail != "--to-offset 5" || audit[0].Identity != "ident" {
		t.Errorf("audit = %+v, want alice's two resets", audit)
	}
}

func contains(tps []sinks.TP, tp sinks.TP) bool {
	for _, x := range tps {
		if x == tp {
			return true
		}
	}
	return false
}

func ptr(p *int64) int64 {
	if p == nil {
		return -1
	}
	return *p
}
