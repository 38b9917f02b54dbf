package rebuild

import (
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
)

// TestOperationsRecordWhoAsked: an operation started and one cancelled
// through a store that knows the command's operating-system user record
// it with the actor and the database session user of the transaction.
func TestOperationsRecordWhoAsked(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	if err := Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	store := NewStore(db.Pool)
	if _, err := store.Ensure(ctx, "app", []*projection.Projection{parse(t, itemsFile)}); err != nil {
		t.Fatal(err)
	}
	op, err := store.AsOSUser("alice").Start(ctx, Request{Identity: "app", Projection: "items", Actor: "ticket-7"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.AsOSUser("bob").Cancel(ctx, op.ID, "ticket-8"); err != nil {
		t.Fatal(err)
	}
	got, _, err := store.Operation(ctx, op.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Actor != "ticket-7" || got.OSUser != "alice" || got.DBUser != "postgres" ||
		got.CancelledBy != "ticket-8" || got.CancelledByOSUser != "bob" || got.CancelledByDBUser != "postgres" {
		t.Errorf("operation %+v: want ticket-7 by alice as postgres, cancelled as ticket-8 by bob as postgres", got)
	}
	// Migrating again leaves the columns as they are.
	if err := Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
}
