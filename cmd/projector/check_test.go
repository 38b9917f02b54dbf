package main

import (
	"bytes"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection/check"
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

// TestCheckCouldNotCheck: a check that could not ask PostgreSQL (down, no
// such database, no such role) or the registry fails with its own exit
// status, 3, distinct from problems found (1), and says which it was;
// only an explicit --no-database or empty --database-url checks without
// PostgreSQL and can pass.
func TestCheckCouldNotCheck(t *testing.T) {
	reg, cl := testenv.Registry(t)
	if _, err := demo.RegisterSchemas(t.Context(), cl); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(t.TempDir(), "good.yaml")
	if err := os.WriteFile(good, demo.Projections, 0o600); err != nil {
		t.Fatal(err)
	}
	dbURL := func(edit func(u *url.URL)) string {
		u, err := url.Parse(testenv.DatabaseURL())
		if err != nil {
			t.Fatal(err)
		}
		edit(u)
		return u.String()
	}
	noDatabase := dbURL(func(u *url.URL) { u.Path = "/projector_no_such_database" })
	noRole := dbURL(func(u *url.URL) { u.User = url.User("projector_no_such_role") })
	down := dbURL(func(u *url.URL) { u.Host = "127.0.0.1:1" })
	for _, tc := range []struct {
		name string
		args []string
		exit int
		says []string // the error (or, on success, the output) says these
	}{
		{"no such database", []string{"--registry-url", reg.URL(), "--database-url", noDatabase}, exitNotChecked,
			[]string{"could not check", `database "projector_no_such_database"`, "the database does not exist", "3D000", "--no-database"}},
		{"no such role", []string{"--registry-url", reg.URL(), "--database-url", noRole}, exitNotChecked,
			[]string{"could not check", `as user "projector_no_such_role"`, "28000", "--no-database"}},
		{"database down", []string{"--registry-url", reg.URL(), "--database-url", down}, exitNotChecked,
			[]string{"could not check", "cannot connect to PostgreSQL at 127.0.0.1:1", "Start PostgreSQL", "--no-database"}},
		{"registry down", []string{"--registry-url", "http://127.0.0.1:1", "--no-database"}, exitNotChecked,
			[]string{"could not check", "subject accounts.events-value"}},
		{"--no-database", []string{"--registry-url", reg.URL(), "--no-database", "--database-url", down}, 0,
			[]string{"note: " + check.NoteNoDatabase, "ok: accounts"}},
		{"empty --database-url", []string{"--registry-url", reg.URL(), "--database-url", ""}, 0,
			[]string{"note: " + check.NoteNoDatabase, "ok: accounts"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := Main(t.Context(), append([]string{"check", "--config", good}, tc.args...), &out, &out)
			if got := exitCode(err); got != tc.exit {
				t.Fatalf("exit status %d (%v), want %d\n%s", got, err, tc.exit, &out)
			}
			said := out.String()
			if err != nil {
				said = err.Error()
				if strings.Contains(out.String(), "ok: ") {
					t.Errorf("check that could not check printed ok:\n%s", &out)
				}
			}
			for _, w := range tc.says {
				if !strings.Contains(said, w) {
					t.Errorf("%q does not say %q", said, w)
				}
			}
		})
	}
}
