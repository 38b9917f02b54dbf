package postgres_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestCheckListsEveryProblemAndWritesNothing: Check reports the problems
// of every projection, not only the first, as the errors Migrate would
// refuse them with, and leaves the database as it found it; on projections
// without problems it finds none, and gives their columns the type names
// Postgres resolves, as Migrate does.
func TestCheckListsEveryProblemAndWritesNothing(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE mismatched (id text PRIMARY KEY, c integer, version bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	badType := oneColumn(t, "badtype", "badtype", "no_such_type", "")
	badDefault := oneColumn(t, "baddefault", "baddefault", "uuid", "nope")
	mismatched := oneColumn(t, "mismatched", "mismatched", "bigint", "")
	good := oneColumn(t, "good", "good", "TIMESTAMPTZ(3)", "")
	problems, err := postgres.Check(ctx, db.Pool, badType, badDefault, mismatched, good)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		sentinel error
		says     string
	}{
		{postgres.ErrBadType, `projection "badtype": column "c": type "no_such_type"`},
		{postgres.ErrBadDefault, `projection "baddefault": column "c": default "nope"`},
		{postgres.ErrTableMismatch, `projection "mismatched": table mismatched: existing table does not match the projection: column c is integer in the table but bigint in the projection`},
	}
	if len(problems) != len(want) {
		t.Fatalf("%d problems, want %d: %v", len(problems), len(want), problems)
	}
	for i, w := range want {
		if !errors.Is(problems[i], w.sentinel) || !strings.Contains(problems[i].Error(), w.says) {
			t.Errorf("problem %d = %v, want %v saying %q", i, problems[i], w.sentinel, w.says)
		}
	}
	if got := good.Columns[1].Type; got != "timestamp(3) with time zone" {
		t.Errorf("good column type = %q, want the name Postgres resolves", got)
	}
	nothingCreated(t, db, "badtype", "baddefault", "good")

	if problems, err := postgres.Check(ctx, db.Pool, good); err != nil || len(problems) > 0 {
		t.Errorf("Check(good) = %v, %v; want no problem", problems, err)
	}
}
