package postgres_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestUnfilledNotNullColumnRefused: an existing table with a column the
// projection does not write, NOT NULL without a default (of its own or of
// its domain), would fail every insert with SQLSTATE 23502 and so
// dead-letter every event. Check reports it and Migrate refuses it,
// naming the table and the column and how to fix it; columns with a
// default, identity and generated columns, nullable ones and the ones the
// projection declares are fine.
func TestUnfilledNotNullColumnRefused(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	if _, err := db.Pool.Exec(ctx, `
		CREATE DOMAIN strict_text AS text NOT NULL;
		CREATE DOMAIN strict_with_default AS text DEFAULT 'x' NOT NULL;
		CREATE TABLE accounts_ext (
			id          text PRIMARY KEY,
			c           bigint NOT NULL,
			version     bigint NOT NULL,
			note        text NOT NULL,
			tag         strict_text,
			defaulted   text NOT NULL DEFAULT 'none',
			dom_default strict_with_default,
			serial_id   bigserial,
			ident       bigint GENERATED ALWAYS AS IDENTITY,
			generated   bigint GENERATED ALWAYS AS (c * 2) STORED,
			nullable    text
		)`); err != nil {
		t.Fatal(err)
	}
	p := oneColumn(t, "ext", "accounts_ext", "bigint", "")

	problems, err := postgres.Check(ctx, db.Pool, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 2 {
		t.Fatalf("Check found %d problems, want 2 (note and tag): %v", len(problems), problems)
	}
	for i, col := range []string{"note", "tag"} {
		err := problems[i]
		if !errors.Is(err, postgres.ErrUnfilledColumn) || !errors.Is(err, postgres.ErrTableMismatch) {
			t.Errorf("problem %v: want ErrUnfilledColumn and ErrTableMismatch", err)
		}
		for _, w := range []string{`projection "ext"`, "table accounts_ext", "column " + col + " ", "23502", "SET DEFAULT", "DROP NOT NULL", "declare it"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("problem %q does not say %q", err, w)
			}
		}
	}

	err = postgres.Migrate(ctx, db.Pool, oneColumn(t, "ext", "accounts_ext", "bigint", ""))
	if !errors.Is(err, postgres.ErrUnfilledColumn) {
		t.Fatalf("Migrate = %v, want ErrUnfilledColumn", err)
	}
	for _, w := range []string{`projection "ext"`, "table accounts_ext", "column note ", "column tag "} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Migrate's error %q does not say %q", err, w)
		}
	}
	nothingCreated(t, db)

	// Each fix the message names clears it: a default, dropping NOT NULL.
	if _, err := db.Pool.Exec(ctx, `ALTER TABLE accounts_ext ALTER COLUMN note SET DEFAULT '';
		ALTER TABLE accounts_ext ALTER COLUMN tag TYPE text, ALTER COLUMN tag DROP NOT NULL`); err != nil {
		t.Fatal(err)
	}
	if problems, err := postgres.Check(ctx, db.Pool, p); err != nil || len(problems) > 0 {
		t.Errorf("Check after the fix = %v, %v; want no problem", problems, err)
	}
	if err := postgres.Migrate(ctx, db.Pool, oneColumn(t, "ext", "accounts_ext", "bigint", "")); err != nil {
		t.Errorf("Migrate after the fix: %v", err)
	}
}

// TestUnfilledDeclaredColumnIsFine: a NOT NULL column without a default
// that the projection declares is the projection's to fill, not a problem
// of the table.
func TestUnfilledDeclaredColumnIsFine(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE declared (id text PRIMARY KEY, c text NOT NULL, version bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	p := oneColumn(t, "declared", "declared", "text", "'-'")
	if problems, err := postgres.Check(ctx, db.Pool, p); err != nil || len(problems) > 0 {
		t.Errorf("Check = %v, %v; want no problem", problems, err)
	}
}
