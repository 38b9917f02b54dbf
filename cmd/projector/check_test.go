package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/schemas"
)

// customerSchema is the schema examples/snapshot.yaml describes in its
// comment.
const customerSchema = `{"type": "record", "name": "Customer", "namespace": "example.customers", "fields": [
	{"name": "customer_id", "type": "string"},
	{"name": "version", "type": "long"},
	{"name": "type", "type": "string"},
	{"name": "name", "type": ["null", "string"], "default": null},
	{"name": "email", "type": ["null", "string"], "default": null},
	{"name": "loyalty_tier", "type": ["null", "string"], "default": null},
	{"name": "credit_limit", "type": "long"},
	{"name": "updated_at", "type": {"type": "long", "logicalType": "timestamp-millis"}}
]}`

// TestCheckExampleFiles: every example projection file passes projector
// check against its schemas, in the registry and in PostgreSQL, so that
// none can rot into a file that check (and so run) refuses.
func TestCheckExampleFiles(t *testing.T) {
	db := testenv.NewDB(t)
	reg, cl := testenv.Registry(t)
	if _, err := demo.RegisterSchemas(t.Context(), cl); err != nil {
		t.Fatal(err)
	}
	if _, err := schemas.Register(t.Context(), cl, "customers-value", customerSchema); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join("..", "..", "examples", "*.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("examples: %v %v", files, err)
	}
	for _, f := range files {
		var out bytes.Buffer
		if err := Main(t.Context(), []string{"check", "--config", f, "--registry-url", reg.URL(), "--database-url", db.URL}, &out, &out); err != nil {
			t.Errorf("check %s: %v\n%s", f, err, &out)
		}
		if !strings.Contains(out.String(), "ok: ") {
			t.Errorf("check %s said\n%s\nwant ok", f, &out)
		}
	}
}

// TestCheckCommand: check prints one line per problem and exits non-zero,
// refuses a number under add with the fix, and answers a producer's CI
// without a registry or a database.
func TestCheckCommand(t *testing.T) {
	db := testenv.NewDB(t)
	reg, cl := testenv.Registry(t)
	if _, err := demo.RegisterSchemas(t.Context(), cl); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", demo.Projections)
	badField := write("badfield.yaml", bytes.Replace(demo.Projections, []byte("{balance: amount}"), []byte("{balance: amout}"), 1))
	number := write("number.yaml", bytes.Replace(demo.Projections, []byte("{balance: amount}"), []byte("{balance: 5}"), 1))
	saga, err := filepath.Abs(filepath.Join("..", "..", "examples", "saga.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sagaSchema, err := os.ReadFile(filepath.Join("..", "..", "examples", "saga.avsc"))
	if err != nil {
		t.Fatal(err)
	}
	compatible := write("compatible.avsc", bytes.Replace(sagaSchema, []byte(`{"name": "reason", "type": ["null", "string"], "default": null}`),
		[]byte(`{"name": "reason", "type": ["null", "string"], "default": null}, {"name": "channel", "type": "string", "default": "web"}`), 1))
	incompatible := write("incompatible.avsc", bytes.Replace(sagaSchema, []byte(`"name": "OrderSagaEvent"`), []byte(`"name": "SagaEvent"`), 1))
	if bytes.Equal(sagaSchema, readFile(t, compatible)) || bytes.Equal(sagaSchema, readFile(t, incompatible)) {
		t.Fatal("the edits of saga.avsc found nothing to edit")
	}

	for _, tc := range []struct {
		name   string
		args   []string
		fails  bool
		output []string // lines the output must have, exactly
		errs   string   // the error must say this
	}{
		{"a good file", []string{"--config", good, "--registry-url", reg.URL(), "--database-url", db.URL}, false,
			[]string{"ok: accounts"}, ""},
		{"a field not in the schema", []string{"--config", badField, "--registry-url", reg.URL(), "--database-url", db.URL}, true,
			[]string{`projection accounts: events.Deposited.add.balance: field "amout" is not in the reader schema demo.accounts.AccountEvent: every Deposited event would be dead-lettered; fix: name one of its fields (account_id, version, type, owner, amount, occurred_at, currency)`},
			"check found problems: 1"},
		{"a number under add", []string{"--config", number, "--no-database"}, true, nil, "5 is not a field name: to add a constant write {literal: 5}"},
		{"no database", []string{"--config", good, "--registry-url", reg.URL(), "--no-database"}, false,
			[]string{"note: " + "PostgreSQL not checked (no database): column types, defaults and existing tables were not proved", "ok: accounts"}, ""},
		{"database unreachable", []string{"--config", good, "--registry-url", reg.URL(), "--database-url", "postgres://postgres@127.0.0.1:1/test?connect_timeout=2"}, false,
			[]string{"ok: accounts"}, ""},
		{"producer CI, compatible", []string{"--config", saga, "--schema-file", compatible, "--projection", "order_sagas", "--no-database"}, false,
			[]string{"projection order_sagas can read events written with compatible.avsc"}, ""},
		{"producer CI, incompatible", []string{"--config", saga, "--schema-file", incompatible, "--projection", "order_sagas", "--no-database"}, true,
			nil, "check found problems: 1"},
		{"bad --writers", []string{"--config", good, "--writers", "first"}, true, nil, `--writers "first": want all or latest`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := Main(t.Context(), append([]string{"check"}, tc.args...), &out, &out)
			if tc.fails != (err != nil) {
				t.Fatalf("check: %v, want failure %v\n%s", err, tc.fails, &out)
			}
			if err != nil && !strings.Contains(err.Error(), tc.errs) {
				t.Errorf("error %q does not say %q", err, tc.errs)
			}
			lines := strings.Split(out.String(), "\n")
			for _, w := range tc.output {
				if !containsLine(lines, w) {
					t.Errorf("output lacks the line %q:\n%s", w, &out)
				}
			}
			if tc.name == "database unreachable" && !strings.Contains(out.String(), "note: PostgreSQL not checked (host 127.0.0.1 port 1") {
				t.Errorf("output does not note the unreachable database:\n%s", &out)
			}
			if tc.name == "producer CI, incompatible" && !strings.Contains(out.String(), "projection order_sagas: schema: events written with incompatible.avsc cannot be read") {
				t.Errorf("output does not say why:\n%s", &out)
			}
			if errors.Is(err, errCheckFailed) && strings.Count(out.String(), "projection ") != 1 {
				t.Errorf("want exactly one problem line:\n%s", &out)
			}
		})
	}
}

func containsLine(lines []string, want string) bool {
	for _, l := range lines {
		if l == want {
			return true
		}
	}
	return false
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
