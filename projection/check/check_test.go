package check_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projection/check"
)

const baseYAML = `projections:
  - name: accounts
    topic: accounts.events
    table: accounts
    key: account_id
    mode: fold
    type_field: type
    columns:
      account_id: {type: text, primary_key: true}
      owner:      {type: text}
      balance:    {type: bigint, default: 0}
      opened_at:  {type: timestamptz}
    events:
      AccountOpened: {set: {owner: owner, opened_at: occurred_at}}
      Deposited:     {add: {balance: amount}}
      Withdrawn:     {add: {balance: -amount}}
`

const snapshotYAML = `projections:
  - name: accounts
    topic: accounts.events
    table: accounts
    key: account_id
    mode: snapshot
    columns:
      account_id: {type: text, primary_key: true}
      owner:      {type: text}
      balance:    {type: bigint, field: amount}
`

func accountSchema(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../schemas/testdata/account_event.avsc")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func edit(t *testing.T, s, old, new string) string {
	t.Helper()
	if !strings.Contains(s, old) {
		t.Fatalf("%q is not in %q", old, s)
	}
	return strings.ReplaceAll(s, old, new)
}

func register(t *testing.T, reg *sr.Client, subject string, schemas ...string) {
	t.Helper()
	for _, s := range schemas {
		if _, err := reg.CreateSchema(t.Context(), subject, sr.Schema{Schema: s}); err != nil {
			t.Fatalf("register %s: %v", subject, err)
		}
	}
}

func parse(t *testing.T, yaml string) []*projection.Projection {
	t.Helper()
	ps, err := projection.Parse([]byte(yaml), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// TestCheckFindsEachProblem: each mistake that would dead-letter events,
// leave a column NULL or fail a write gives exactly its one line, naming
// the projection, the place in the file and the fix.
func TestCheckFindsEachProblem(t *testing.T) {
	avsc := accountSchema(t)
	type setup struct {
		yaml    string
		writers []string // registered under accounts.events-value, in order
		reader  string   // a schema: file's content, "" for none
		table   string   // created before the check
		latest  bool
	}
	cases := []struct {
		name  string
		setup func(t *testing.T) setup
		want  []string // "" want: no problem
	}{
		{"a good file", func(*testing.T) setup { return setup{yaml: baseYAML, writers: []string{avsc}} }, nil},
		{"a good snapshot file", func(*testing.T) setup { return setup{yaml: snapshotYAML, writers: []string{avsc}} }, nil},
		{"wrong key", func(t *testing.T) setup {
			return setup{yaml: edit(t, baseYAML, "account_id", "acct_id"), writers: []string{avsc}}
		}, []string{"projection accounts: key:", `field "acct_id" is not in the reader schema demo.accounts.AccountEvent`, "account_id, version"}},
		{"wrong type_field", func(t *testing.T) setup {
			return setup{yaml: edit(t, baseYAML, "type_field: type", "type_field: kind"), writers: []string{avsc}}
		}, []string{"projection accounts: type_field:", `field "kind"`, "fix:"}},
		{"type_field not a string", func(t *testing.T) setup {
			return setup{yaml: edit(t, baseYAML, "type_field: type", "type_field: amount"), writers: []string{avsc}}
		}, []string{"projection accounts: type_field:", `field "amount" is long`, "string or enum"}},
		{"wrong add field", func(t *testing.T) setup {
			return setup{yaml: edit(t, baseYAML, "{balance: amount}", "{balance: amout}"), writers: []string{avsc}}
		}, []string{"projection accounts: events.Deposited.add.balance:", `field "amout" is not in the reader schema`}},
		{"add from a string field", func(t *testing.T) setup {
			return setup{yaml: edit(t, baseYAML, "{balance: amount}", "{balance: owner}"), writers: []string{avsc}}
		}, []string{"projection accounts: events.Deposited.add.balance:", `field "owner" is nullable string`, "numeric"}},
		{"a column type the field cannot fill", func(t *testing.T) setup {
			return setup{yaml: edit(t, baseYAML, "opened_at:  {type: timestamptz}", "opened_at:  {type: boolean}"), writers: []string{avsc}}
		}, []string{"projection accounts: events.AccountOpened.set.opened_at:", "boolean cannot hold Avro long (timestamp-millis)"}},
		{"snapshot column without its field", func(t *testing.T) setup {
			return setup{yaml: edit(t, snapshotYAML, "      owner:      {type: text}\n", "      owner:      {type: text}\n      nickname:   {type: text}\n"), writers: []string{avsc}}
		}, []string{"projection accounts: columns.nickname.field:", `field "nickname" is not in the reader schema`, "the column would always be NULL", "field:"}},
		{"record name differing", func(t *testing.T) setup {
			return setup{yaml: baseYAML, writers: []string{avsc}, reader: edit(t, avsc, `"name": "AccountEvent"`, `"name": "AccountEvt"`)}
		}, []string{"projection accounts: schema:", "writer version 1", "names do not match"}},
		{"writer version 1 incompatible, the latest fine", func(t *testing.T) setup {
			return setup{yaml: baseYAML, writers: []string{edit(t, avsc, `{"name": "amount", "type": "long", "default": 0}`, `{"name": "amount", "type": "string"}`), avsc}}
		}, []string{"projection accounts: schema:", "writer version 1 ", "--writers latest"}},
		{"writer version 1 incompatible, only the latest checked", func(t *testing.T) setup {
			return setup{yaml: baseYAML, latest: true, writers: []string{edit(t, avsc, `{"name": "amount", "type": "long", "default": 0}`, `{"name": "amount", "type": "string"}`), avsc}}
		}, nil},
		{"nullable key", func(t *testing.T) setup {
			return setup{yaml: baseYAML, writers: []string{avsc}, reader: edit(t, avsc, `{"name": "account_id", "type": "string"}`, `{"name": "account_id", "type": ["null", "string"], "default": null}`)}
		}, []string{"projection accounts: key:", `field "account_id" is nullable`}},
		{"nullable version", func(t *testing.T) setup {
			return setup{yaml: baseYAML, writers: []string{avsc}, reader: edit(t, avsc, `{"name": "version", "type": "long"}`, `{"name": "version", "type": ["null", "long"], "default": null}`)}
		}, []string{"projection accounts: version:", `field "version" is nullable`}},
		{"no schema registered", func(*testing.T) setup { return setup{yaml: baseYAML} },
			[]string{"projection accounts: schema:", "no schema registered under subject accounts.events-value"}},
		{"default not of its type", func(t *testing.T) setup {
			return setup{yaml: edit(t, baseYAML, "opened_at:  {type: timestamptz}", `opened_at:  {type: timestamptz, default: "not a time"}`), writers: []string{avsc}}
		}, []string{"projection accounts:", `column "opened_at"`, "not a time", "fix: give a default"}},
		{"table present with a different column type", func(t *testing.T) setup {
			return setup{yaml: baseYAML, writers: []string{avsc},
				table: `CREATE TABLE accounts (account_id text PRIMARY KEY, owner text, balance integer, opened_at timestamptz, version bigint NOT NULL)`}
		}, []string{"projection accounts:", "table accounts", "column balance is integer in the table but bigint in the projection", "fix: alter the table"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.setup(t)
			_, reg := testenv.Registry(t)
			register(t, reg, "accounts.events-value", s.writers...)
			db := testenv.NewDB(t)
			if s.table != "" {
				if _, err := db.Pool.Exec(t.Context(), s.table); err != nil {
					t.Fatal(err)
				}
			}
			projs := parse(t, s.yaml)
			projs[0].Schema = s.reader
			cfg := check.Config{Projections: projs, Registry: reg, DB: db.Pool, RequireDB: true}
			if s.latest {
				cfg.Writers = check.WritersLatest
			}
			rep, err := check.Run(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if err := rep.Err(); err != nil {
					t.Fatalf("a good file: %v", err)
				}
				return
			}
			if len(rep.Problems) != 1 {
				t.Fatalf("%d problems, want 1: %v", len(rep.Problems), rep.Err())
			}
			line := rep.Problems[0].String()
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("problem %q does not say %q", line, w)
				}
			}
			if strings.Contains(line, "\n") {
				t.Errorf("problem %q is more than one line", line)
			}
			if s.table == "" {
				var exists bool
				if err := db.Pool.QueryRow(context.WithoutCancel(t.Context()), `SELECT to_regclass('accounts') IS NOT NULL OR to_regclass('projector_offsets') IS NOT NULL`).Scan(&exists); err != nil || exists {
					t.Errorf("the check created tables (%v)", err)
				}
			}
		})
	}
}

// TestCheckNamedTypeReferences: a field whose type names a type defined
// earlier in the schema (an enum used twice, a record in a union) is
// checked as the type it names.
func TestCheckNamedTypeReferences(t *testing.T) {
	reader := `{"type": "record", "name": "Painted", "fields": [
		{"name": "id", "type": "string"},
		{"name": "version", "type": "long"},
		{"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
		{"name": "colors", "type": {"type": "array", "items": "Color"}},
		{"name": "kind", "type": "Color"},
		{"name": "spot", "type": {"type": "record", "name": "Spot", "fields": [{"name": "x", "type": "long"}]}},
		{"name": "choice", "type": ["null", "string", "Spot"], "default": null}
	]}`
	projs := parse(t, `projections:
  - name: painted
    topic: painted
    table: painted
    key: id
    mode: snapshot
    columns:
      id:     {type: text, primary_key: true}
      color:  {type: text}
      colors: {type: "text[]"}
      kind:   {type: text}
      spot:   {type: jsonb}
      choice: {type: text}
`)
	projs[0].Schema = reader
	rep, err := check.Run(t.Context(), check.Config{Projections: projs})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) > 0 {
		t.Fatalf("problems with a good file: %v", rep.Err())
	}
	projs = parse(t, `projections:
  - name: painted
    topic: painted
    table: painted
    key: id
    mode: snapshot
    columns:
      id:     {type: text, primary_key: true}
      colors: {type: "bigint[]"}
`)
	projs[0].Schema = reader
	if rep, err = check.Run(t.Context(), check.Config{Projections: projs}); err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0].String(), "columns.colors.field: field \"colors\" into column colors: array items: column type bigint cannot hold Avro enum Color") {
		t.Fatalf("problems %v, want one saying the enum items cannot fill bigint[]", rep.Err())
	}
}
