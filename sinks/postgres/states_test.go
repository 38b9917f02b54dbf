package postgres_test

import (
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestStatesKeepTheHalt: a member's record of a halted partition keeps
// what halted it. A states table from before halts were named is still
// read (without them) until migrate adds the column, which it does once,
// keeping the rows.
func TestStatesKeepTheHalt(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE projector_partition_states (
		identity text NOT NULL, topic text NOT NULL, partition integer NOT NULL, state text NOT NULL,
		reason text NOT NULL, member text NOT NULL, since timestamptz NOT NULL,
		updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (identity, topic, partition))`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO projector_partition_states (identity, topic, partition, state, reason, member, since)
		VALUES ('ident', 't', 1, 'stalled', 'records wait', 'old-member', now())`); err != nil {
		t.Fatal(err)
	}
	tp0, tp1 := sinks.TP{Topic: "t", Partition: 0}, sinks.TP{Topic: "t", Partition: 1}
	got, err := postgres.States(ctx, db.Pool, "ident")
	if err != nil {
		t.Fatalf("states of a table from before halts were named: %v", err)
	}
	if s := got[tp1]; len(got) != 1 || s.State != sinks.PartitionStalled || s.Member != "old-member" || s.Halt != "" {
		t.Fatalf("states of a table from before halts were named: %+v", got)
	}

	for range 2 {
		if err := postgres.Migrate(ctx, db.Pool); err != nil {
			t.Fatal(err)
		}
	}
	since := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	store := postgres.NewStore(db.Pool)
	if err := store.RecordStates(ctx, "ident", "m1", []sinks.PartitionState{
		{TP: tp0, State: sinks.PartitionHalted, Halt: sinks.HaltDeadLetterStorm, Reason: "dead-letter storm: …", Since: since},
	}); err != nil {
		t.Fatal(err)
	}
	if got, err = postgres.States(ctx, db.Pool, "ident"); err != nil {
		t.Fatal(err)
	}
	s := got[tp0]
	if s.State != sinks.PartitionHalted || s.Halt != sinks.HaltDeadLetterStorm || s.Reason != "dead-letter storm: …" || !s.Since.Equal(since) || s.Member != "m1" {
		t.Errorf("recorded halt read back as %+v, want halted (%s) since %s by m1", s, sinks.HaltDeadLetterStorm, since)
	}
	if s := got[tp1]; s.State != sinks.PartitionStalled || s.Halt != "" {
		t.Errorf("the row from before migrate read back as %+v", s)
	}
}
