package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/demo"
)

// TestUnfilledColumnRefused: an existing table with a NOT NULL column
// without a default that the projection does not fill would dead-letter
// every event (SQLSTATE 23502). check reports it as a problem (exit
// status 1), and run and dev refuse to start, naming the table, the column
// and the fixes, before they join the group.
func TestUnfilledColumnRefused(t *testing.T) {
	e := newRunEnv(t, 3, 0)
	var out bytes.Buffer
	if err := Main(t.Context(), []string{"migrate", "--config", e.config, "--database-url", e.db.URL}, &out, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, &out)
	}
	if _, err := e.db.Pool.Exec(t.Context(), `ALTER TABLE accounts ADD COLUMN region text NOT NULL`); err != nil {
		t.Fatal(err)
	}
	says := []string{"table accounts", "column region (text)", "23502", "SET DEFAULT", "DROP NOT NULL", "declare it among the projection's columns"}

	out.Reset()
	err := Main(t.Context(), []string{"check", "--config", e.config, "--registry-url", e.reg.URL(), "--database-url", e.db.URL}, &out, &out)
	if !errors.Is(err, errCheckFailed) || exitCode(err) != exitFailed {
		t.Fatalf("check: %v (exit status %d), want problems found (exit status %d)\n%s", err, exitCode(err), exitFailed, &out)
	}
	for _, w := range append([]string{"projection accounts: "}, says...) {
		if !strings.Contains(out.String(), w) {
			t.Errorf("check's output does not say %q:\n%s", w, &out)
		}
	}

	// dev starts its registry empty: the reader schema comes from the file.
	schemas, err := demo.Schemas()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	config := filepath.Join(dir, "projections.yaml")
	withSchema := bytes.Replace(demo.Projections, []byte("    table: accounts\n"), []byte("    table: accounts\n    schema: account_event.avsc\n"), 1)
	if bytes.Equal(withSchema, demo.Projections) {
		t.Fatal("the demo projection file names another table")
	}
	for name, b := range map[string][]byte{config: withSchema, filepath.Join(dir, "account_event.avsc"): []byte(schemas["account_event"])} {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"run", e.args("unfilled")},
		{"dev", []string{"dev", "--config", config, "--database-url", e.db.URL, "--brokers-addr", "127.0.0.1:0",
			"--registry-addr", "127.0.0.1:0", "--http-addr", "", "--partitions", "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			var out bytes.Buffer
			err := Main(ctx, tc.args, &out, &out)
			if err == nil || ctx.Err() != nil {
				t.Fatalf("%s: %v, want it to refuse to start\n%s", tc.name, err, &out)
			}
			for _, w := range says {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	for _, g := range e.groups(t) {
		if g == "unfilled" {
			t.Errorf("run joined group %q on a table it cannot write", g)
		}
	}
}
