package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
)

// TestMigrateProvesTheFileFirst runs `projector migrate` on projection
// files with a mistake Postgres would only meet later (a constraint in a
// column type, a default the type refuses, two projections on one table,
// a schema file outside the projection file's directory): each stops the
// command with an error naming the mistake, before any table is created,
// and never prints the content of a file the schema path names.
func TestMigrateProvesTheFileFirst(t *testing.T) {
	const secret = "s3cr3t-do-not-print"
	outside := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(outside, []byte("token="+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	projection := func(name, table, column, extra string) string {
		return fmt.Sprintf(`  - name: %s
    topic: %s.events
    table: %s
    key: id
    mode: snapshot%s
    columns:
      id: {type: text, primary_key: true}
      c:  %s
`, name, name, table, extra, column)
	}
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"a constraint in a column type", projection("things", "things", "{type: text unique not null default current_user}", ""),
			[]string{`projection "things"`, `column "c"`, "not a Postgres type"}},
		{"a reference in a column type", projection("things", "things", "{type: text references orders}", ""),
			[]string{`projection "things"`, `column "c"`, "not a Postgres type"}},
		{"a default its type refuses", projection("things", "things", `{type: timestamptz, default: "not a time"}`, ""),
			[]string{`projection "things"`, `column "c"`, "not a time", "timestamp with time zone"}},
		{"two projections on one table", projection("first", "t", "{type: text}", "") + projection("second", "%s.t", "{type: text}", ""),
			[]string{`"first"`, `"second"`, "one table"}},
		{"a schema file outside", projection("things", "things", "{type: text}", "\n    schema: "+outside),
			[]string{`projection "things"`, "schema", "inside"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := testenv.NewDB(t)
			file := filepath.Join(t.TempDir(), "projections.yaml")
			src := "projections:\n" + strings.ReplaceAll(tc.file, "%s", db.Schema)
			if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			err := Main(t.Context(), []string{"migrate", "--database-url", db.URL, "--config", file}, &out, &out)
			if err == nil {
				t.Fatalf("projector migrate accepted:\n%s\noutput: %s", src, &out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if strings.Contains(err.Error()+out.String(), secret) {
				t.Errorf("projector migrate printed the content of the schema file: %v\n%s", err, &out)
			}
			var created bool
			if err := db.Pool.QueryRow(t.Context(), `SELECT to_regclass('projector_offsets') IS NOT NULL OR to_regclass('things') IS NOT NULL
				OR to_regclass('t') IS NOT NULL`).Scan(&created); err != nil || created {
				t.Errorf("a refused migration created tables (err %v)", err)
			}
		})
	}

	t.Run("type names as Postgres writes them", func(t *testing.T) {
		db := testenv.NewDB(t)
		file := filepath.Join(t.TempDir(), "projections.yaml")
		src := "projections:\n" + projection("things", "things", `{type: timestamp(3) with time zone, default: "2026-01-01T00:00:00Z"}`, "")
		if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		for range 2 { // the second run finds the table the first created
			var out bytes.Buffer
			if err := Main(t.Context(), []string{"migrate", "--database-url", db.URL, "--config", file}, &out, &out); err != nil {
				t.Fatalf("projector migrate: %v\n%s", err, &out)
			}
		}
		var typ string
		if err := db.Pool.QueryRow(t.Context(), `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
			WHERE attrelid = 'things'::regclass AND attname = 'c'`).Scan(&typ); err != nil || typ != "timestamp(3) with time zone" {
			t.Errorf("column c is %q (%v), want timestamp(3) with time zone", typ, err)
		}
	})
}
