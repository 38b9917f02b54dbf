package rebuild

import (
	"errors"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
)

// TestStartChecksARepairedDefinition starts rebuilds with definitions
// whose gaps are repaired, which carry no repair source of their own: one
// naming another table is refused like any other, the right one accepted.
func TestStartChecksARepairedDefinition(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	if err := Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	store := NewStore(db.Pool)
	if _, err := store.Ensure(ctx, "app", []*projection.Projection{parse(t, itemsFile)}); err != nil {
		t.Fatal(err)
	}
	repaired := func(table string) *projection.Definition {
		file := strings.Replace(itemsFile, "    mode: snapshot\n", "    mode: snapshot\n    on_gap: repair\n    repair: {http: {url: \"http://source/{key}\"}}\n", 1)
		file = strings.Replace(file, "table: items", "table: "+table, 1)
		def, err := parse(t, file).Definition()
		if err != nil {
			t.Fatal(err)
		}
		return &def
	}
	_, err := store.Start(ctx, Request{Identity: "app", Projection: "items", Definition: repaired("other")})
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeBadDefinition || !strings.Contains(e.Message, "other") {
		t.Fatalf("a repaired definition naming another table: %v, want %s", err, CodeBadDefinition)
	}
	op, err := store.Start(ctx, Request{Identity: "app", Projection: "items", Definition: repaired("items")})
	if err != nil || op.State != StateAccepted {
		t.Fatalf("a repaired definition of the same table: %+v, %v", op, err)
	}
}
