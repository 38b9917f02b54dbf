package projection_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/projection"
)

func columnNames(cols []projection.Column) []string {
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = c.Name
	}
	return names
}

func TestParseDemo(t *testing.T) {
	ps, err := projection.Parse(demo.Projections, ".")
	if err != nil {
		t.Fatalf("Parse(demo): %v", err)
	}
	if len(ps) != 1 {
		t.Fatalf("got %d projections, want 1", len(ps))
	}
	p := ps[0]
	if p.Name != "accounts" || p.Topic != demo.Topic || p.Table != demo.Table {
		t.Errorf("name/topic/table = %q/%q/%q, want accounts/%s/%s", p.Name, p.Topic, p.Table, demo.Topic, demo.Table)
	}
	if p.KeyField != "account_id" || p.KeyColumn != "account_id" {
		t.Errorf("key field/column = %q/%q, want account_id", p.KeyField, p.KeyColumn)
	}
	if p.VersionField != "version" || p.TypeField != "type" {
		t.Errorf("version/type field = %q/%q, want version/type", p.VersionField, p.TypeField)
	}
	if p.Mode != projection.ModeFold {
		t.Errorf("mode = %q, want fold", p.Mode)
	}
	if p.OnGap != projection.GapHold {
		t.Errorf("on_gap = %q, want the default hold", p.OnGap)
	}
	if got, want := columnNames(p.Columns), []string{"account_id", "owner", "balance", "opened_at"}; !reflect.DeepEqual(got, want) {
		t.Errorf("columns = %v, want %v (file order)", got, want)
	}
	wantCols := []projection.Column{
		{Name: "account_id", Type: "text", PrimaryKey: true, Field: "account_id"},
		{Name: "owner", Type: "text", Field: "owner"},
		{Name: "balance", Type: "bigint", Default: int64(0), Field: "balance"},
		{Name: "opened_at", Type: "timestamptz", Field: "opened_at"},
	}
	if !reflect.DeepEqual(p.Columns, wantCols) {
		t.Errorf("columns =\n %#v\nwant\n %#v", p.Columns, wantCols)
	}
	if !reflect.DeepEqual(p.DeleteTypes, map[string]bool{"AccountClosed": true}) {
		t.Errorf("delete types = %v, want only AccountClosed", p.DeleteTypes)
	}
	if p.Compiled() == nil {
		t.Error("no fold compiled")
	}
	if p.Schema != "" {
		t.Errorf("schema = %q, want empty (none given)", p.Schema)
	}
	if err := p.Validate(); err != nil {
		t.Errorf("Validate of a parsed projection: %v", err)
	}
}

const baseYAML = `projections:
  - name: p1
    topic: t1
    table: tbl
    key: id
    mode: fold
    type_field: type
    columns:
      id: {type: text, primary_key: true}
      name: {type: text}
      n: {type: bigint}
    events:
      Created: {set: {name: name}}
`

const secondYAML = `  - name: p2
    topic: t2
    table: tbl2
    key: id
    mode: snapshot
    columns:
      id: {type: text, primary_key: true}
`

func TestParseDefaultsAndKeyFirst(t *testing.T) {
	ps, err := projection.Parse([]byte(`projections:
  - name: snap
    topic: s
    table: app.snap
    key: id
    mode: snapshot
    columns:
      a: {type: text}
      b: {type: BIGINT}
      id: {type: text, primary_key: true}
      c: {type: boolean, field: is_c}
`), ".")
	if err != nil {
		t.Fatal(err)
	}
	p := ps[0]
	if got, want := columnNames(p.Columns), []string{"id", "a", "b", "c"}; !reflect.DeepEqual(got, want) {
		t.Errorf("columns = %v, want %v (key first, the rest in file order)", got, want)
	}
	if !p.Columns[0].PrimaryKey {
		t.Error("first column is not the primary key")
	}
	if p.VersionField != "version" {
		t.Errorf("version field = %q, want the default version", p.VersionField)
	}
	if p.OnGap != projection.GapHold {
		t.Errorf("on_gap = %q, want the default hold", p.OnGap)
	}
	if p.Columns[2].Type != "bigint" {
		t.Errorf("type %q not normalised to lower case", p.Columns[2].Type)
	}
	if p.Columns[3].Field != "is_c" || p.Columns[1].Field != "a" {
		t.Errorf("fields = %q, %q; want is_c (renamed) and a (default: the column name)", p.Columns[3].Field, p.Columns[1].Field)
	}
	if p.TypeField != "" {
		t.Errorf("type field = %q, want empty", p.TypeField)
	}
	if got := p.TableFillfactor(); got != projection.DefaultFillfactor {
		t.Errorf("table fillfactor = %d, want the default %d", got, projection.DefaultFillfactor)
	}
}

func TestParseFillfactor(t *testing.T) {
	ps, err := projection.Parse([]byte(edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    fillfactor: 90\n")), ".")
	if err != nil {
		t.Fatal(err)
	}
	if got := ps[0].TableFillfactor(); got != 90 {
		t.Errorf("table fillfactor = %d, want 90 as the file says", got)
	}
}

func TestParseVersionFieldAndOnGap(t *testing.T) {
	src := "projections:\n" + edit(t, secondYAML, "    mode: snapshot\n", "    mode: snapshot\n    version: seq\n    on_gap: apply\n")
	ps, err := projection.Parse([]byte(src), ".")
	if err != nil {
		t.Fatal(err)
	}
	if ps[0].VersionField != "seq" || ps[0].OnGap != projection.GapApply {
		t.Errorf("version/on_gap = %q/%q, want seq/apply", ps[0].VersionField, ps[0].OnGap)
	}
}

func TestParseTwoProjections(t *testing.T) {
	ps, err := projection.Parse([]byte(baseYAML+secondYAML), ".")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].Name != "p1" || ps[1].Name != "p2" {
		t.Fatalf("got %d projections (%v), want p1 and p2 in order", len(ps), ps)
	}
}

// TestParseSharedTopic: several read models of one stream are declared
// by giving them one topic and each its own table.
func TestParseSharedTopic(t *testing.T) {
	ps, err := projection.Parse([]byte(baseYAML+edit(t, secondYAML, "topic: t2", "topic: t1")), ".")
	if err != nil {
		t.Fatalf("two projections of one topic refused: %v", err)
	}
	if len(ps) != 2 || ps[0].Topic != "t1" || ps[1].Topic != "t1" {
		t.Fatalf("got %v, want p1 and p2 both on t1", ps)
	}
}

// edit returns base with old replaced by new, failing when old is absent so
// a case cannot silently test the valid file.
func edit(t *testing.T, base, old, new string) string {
	t.Helper()
	if !strings.Contains(base, old) {
		t.Fatalf("test bug: %q not in the base config", old)
	}
	return strings.Replace(base, old, new, 1)
}

func TestParseRejects(t *testing.T) {
	if _, err := projection.Parse([]byte(baseYAML), "."); err != nil {
		t.Fatalf("the base config must be valid: %v", err)
	}
	cases := []struct {
		name string
		yaml func(t *testing.T) string
		want []string
	}{
		{"missing topic", func(t *testing.T) string { return edit(t, baseYAML, "    topic: t1\n", "") },
			[]string{`projection "p1"`, "topic is required"}},
		{"no mode", func(t *testing.T) string { return edit(t, baseYAML, "    mode: fold\n", "") },
			[]string{`projection "p1"`, "mode is required"}},
		{"unknown mode", func(t *testing.T) string { return edit(t, baseYAML, "mode: fold", "mode: folding") },
			[]string{`projection "p1"`, `mode "folding"`}},
		{"on_gap apply in fold mode", func(t *testing.T) string {
			return edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    on_gap: apply\n")
		}, []string{`projection "p1"`, "on_gap apply"}},
		{"fillfactor too low", func(t *testing.T) string {
			return edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    fillfactor: 5\n")
		}, []string{`projection "p1"`, "fillfactor 5", "10 to 100"}},
		{"filterable names no column", func(t *testing.T) string {
			return edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    filterable: [name, colour]\n")
		}, []string{`projection "p1"`, `filterable: "colour"`, "id, name, n"}},
		{"filterable twice", func(t *testing.T) string {
			return edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    filterable: [name, name]\n")
		}, []string{`projection "p1"`, `filterable: "name" appears twice`}},
		{"tenant names no column", func(t *testing.T) string {
			return edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    tenant: org\n")
		}, []string{`projection "p1"`, `tenant: "org"`, "id, name, n"}},
		{"fillfactor too high", func(t *testing.T) string {
			return edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    fillfactor: 101\n")
		}, []string{`projection "p1"`, "fillfactor 101"}},
		{"unknown on_gap", func(t *testing.T) string {
			return edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    on_gap: skip\n")
		}, []string{`projection "p1"`, `on_gap "skip"`}},
		{"two primary keys", func(t *testing.T) string {
			return edit(t, baseYAML, "n: {type: bigint}", "n: {type: bigint, primary_key: true}")
		}, []string{`projection "p1"`, "primary_key", "found 2 (id, n)"}},
		{"misspelt column field", func(t *testing.T) string {
			return edit(t, baseYAML, "n: {type: bigint}", "n: {type: bigint, defualt: 5}")
		}, []string{`projection "p1"`, `column "n"`, `unknown field "defualt"`}},
		{"delete_on in fold mode", func(t *testing.T) string {
			return edit(t, baseYAML, "    events:", "    delete_on: [Gone]\n    events:")
		}, []string{`projection "p1"`, "delete_on", "delete: true"}},
		{"integer default out of range", func(t *testing.T) string {
			return edit(t, baseYAML, "n: {type: bigint}", "n: {type: smallint, default: 40000}")
		}, []string{`projection "p1"`, `column "n"`, "out of range"}},
		{"no primary key", func(t *testing.T) string {
			return edit(t, baseYAML, "id: {type: text, primary_key: true}", "id: {type: text}")
		}, []string{`projection "p1"`, "primary_key", "found 0"}},
		{"column named version", func(t *testing.T) string {
			return edit(t, baseYAML, "      n: {type: bigint}\n", "      n: {type: bigint}\n      version: {type: bigint}\n")
		}, []string{`projection "p1"`, `column "version"`}},
		{"column twice", func(t *testing.T) string {
			return edit(t, baseYAML, "      n: {type: bigint}\n", "      n: {type: bigint}\n      n: {type: text}\n")
		}, []string{`"n"`}},
		{"column not an identifier", func(t *testing.T) string {
			return edit(t, baseYAML, "      n: {type: bigint}\n", "      Bad-Name: {type: bigint}\n")
		}, []string{`projection "p1"`, `column "Bad-Name"`}},
		{"column without type", func(t *testing.T) string {
			return edit(t, baseYAML, "n: {type: bigint}", "n: {default: 1}")
		}, []string{`projection "p1"`, `column "n"`, "type is required"}},
		{"bad column type", func(t *testing.T) string {
			return edit(t, baseYAML, "n: {type: bigint}", "n: {type: \"bigint; drop table x\"}")
		}, []string{`projection "p1"`, `column "n"`, "not a Postgres type"}},
		{"default that does not fit", func(t *testing.T) string {
			return edit(t, baseYAML, "n: {type: bigint}", "n: {type: bigint, default: lots}")
		}, []string{`projection "p1"`, `column "n"`, "default"}},
		{"no columns", func(t *testing.T) string {
			return edit(t, baseYAML, "    columns:\n      id: {type: text, primary_key: true}\n      name: {type: text}\n      n: {type: bigint}\n", "")
		}, []string{`projection "p1"`, "columns"}},
		{"key is not the primary key column", func(t *testing.T) string { return edit(t, baseYAML, "key: id", "key: name") },
			[]string{`projection "p1"`, `key column "name"`}},
		{"missing key", func(t *testing.T) string { return edit(t, baseYAML, "    key: id\n", "") },
			[]string{`projection "p1"`, "key"}},
		{"bad table", func(t *testing.T) string { return edit(t, baseYAML, "table: tbl", "table: Tbl;x") },
			[]string{`projection "p1"`, `table "Tbl;x"`}},
		{"bad name", func(t *testing.T) string { return edit(t, baseYAML, "name: p1", "name: P-1") },
			[]string{`projection "P-1"`, "name"}},
		{"no name", func(t *testing.T) string { return edit(t, baseYAML, "  - name: p1\n    topic", "  - topic") },
			[]string{"projections[0]", "name is required"}},
		{"fold mode without type_field", func(t *testing.T) string { return edit(t, baseYAML, "    type_field: type\n", "") },
			[]string{`projection "p1"`, "type_field"}},
		{"fold mode without events", func(t *testing.T) string {
			return edit(t, baseYAML, "    events:\n      Created: {set: {name: name}}\n", "")
		}, []string{`projection "p1"`, "events"}},
		{"events in snapshot mode", func(t *testing.T) string { return edit(t, baseYAML, "mode: fold", "mode: snapshot") },
			[]string{`projection "p1"`, "events"}},
		{"unknown field (strict)", func(t *testing.T) string {
			return edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    typo_field: x\n")
		}, []string{"typo_field", "line 7"}},
		{"unknown field in an event (strict)", func(t *testing.T) string {
			return edit(t, baseYAML, "{set: {name: name}}", "{sett: {name: name}}")
		}, []string{"sett", "line 13"}},
		{"set to an unknown column", func(t *testing.T) string { return edit(t, baseYAML, "{set: {name: name}}", "{set: {nope: name}}") },
			[]string{`projection "p1"`, "events.Created.set", `"nope"`}},
		{"set of the key column", func(t *testing.T) string { return edit(t, baseYAML, "{set: {name: name}}", "{set: {id: other}}") },
			[]string{`projection "p1"`, "events.Created.set", `"id"`}},
		{"set literal that does not fit", func(t *testing.T) string { return edit(t, baseYAML, "{set: {name: name}}", "{set: {n: true}}") },
			[]string{`projection "p1"`, "events.Created.set.n", "column n"}},
		{"set with a malformed literal", func(t *testing.T) string {
			return edit(t, baseYAML, "{set: {name: name}}", "{set: {name: {literal: x, other: y}}}")
		}, []string{`projection "p1"`, "events.Created.set.name"}},
		{"add to a text column", func(t *testing.T) string { return edit(t, baseYAML, "{set: {name: name}}", "{add: {name: amount}}") },
			[]string{`projection "p1"`, "events.Created.add.name", "not numeric"}},
		{"add to an unknown column", func(t *testing.T) string { return edit(t, baseYAML, "{set: {name: name}}", "{add: {nope: amount}}") },
			[]string{`projection "p1"`, "events.Created.add", `"nope"`}},
		{"add with an empty field", func(t *testing.T) string { return edit(t, baseYAML, "{set: {name: name}}", `{add: {n: "-"}}`) },
			[]string{`projection "p1"`, "events.Created.add.n", "empty"}},
		{"delete with set", func(t *testing.T) string {
			return edit(t, baseYAML, "{set: {name: name}}", "{set: {name: name}, delete: true}")
		}, []string{`projection "p1"`, "events.Created", "delete cannot be combined"}},
		{"delete with add", func(t *testing.T) string {
			return edit(t, baseYAML, "{set: {name: name}}", "{add: {n: amount}, delete: true}")
		}, []string{`projection "p1"`, "events.Created", "delete cannot be combined"}},
		{"duplicate names", func(t *testing.T) string { return baseYAML + edit(t, secondYAML, "name: p2", "name: p1") },
			[]string{`projection "p1" is defined twice`}},
		{"repair on a shared topic", func(t *testing.T) string {
			return baseYAML + edit(t, edit(t, secondYAML, "topic: t2", "topic: t1"), "mode: snapshot\n", "mode: snapshot\n    on_gap: repair\n    repair: {http: {url: \"http://src/{key}\"}}\n")
		}, []string{`projection "p2"`, "on_gap repair", `topic "t1"`, `projection "p1"`}},
		{"two projections on one table", func(t *testing.T) string { return baseYAML + edit(t, secondYAML, "table: tbl2", "table: tbl") },
			[]string{`projection "p2"`, `table "tbl"`, `projection "p1"`}},
		{"a comment in a column type", func(t *testing.T) string {
			return edit(t, baseYAML, "n: {type: bigint}", "n: {type: \"bigint -- x\"}")
		}, []string{`projection "p1"`, `column "n"`, "not a Postgres type"}},
		{"missing schema file", func(t *testing.T) string {
			return edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    schema: does-not-exist.avsc\n")
		}, []string{`projection "p1"`, "schema", "does-not-exist.avsc"}},
		{"add with a number", func(t *testing.T) string {
			return edit(t, baseYAML, "{set: {name: name}}", "{add: {n: 5}}")
		}, []string{`projection "p1"`, "events.Created.add.n", "5 is not a field name", "{literal: 5}"}},
		{"add with a boolean", func(t *testing.T) string {
			return edit(t, baseYAML, "{set: {name: name}}", "{add: {n: true}}")
		}, []string{`projection "p1"`, "events.Created.add.n", "{literal: true}"}},
		{"add a string literal", func(t *testing.T) string {
			return edit(t, baseYAML, "{set: {name: name}}", "{add: {n: {literal: five}}}")
		}, []string{`projection "p1"`, "events.Created.add.n", "want a number"}},
		{"add literal with another key", func(t *testing.T) string {
			return edit(t, baseYAML, "{set: {name: name}}", "{add: {n: {literal: 5, field: x}}}")
		}, []string{`projection "p1"`, "events.Created.add.n", "{literal: number}"}},
		{"empty file", func(*testing.T) string { return "" }, []string{"no projections defined"}},
		{"empty list", func(*testing.T) string { return "projections: []\n" }, []string{"no projections defined"}},
		{"not YAML", func(*testing.T) string { return "projections: [\n" }, []string{"parse"}},
	}
	// anyOf: the error must mention at least one of these too.
	anyOf := map[string][]string{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := tc.yaml(t)
			ps, err := projection.Parse([]byte(src), t.TempDir())
			if err == nil {
				t.Fatalf("Parse accepted the config (%d projections):\n%s", len(ps), src)
			}
			if ps != nil {
				t.Errorf("Parse returned projections with its error: %v", ps)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if anyOf := anyOf[tc.name]; len(anyOf) > 0 && !slices.ContainsFunc(anyOf, func(w string) bool { return strings.Contains(err.Error(), w) }) {
				t.Errorf("error %q mentions none of %q", err, anyOf)
			}
		})
	}
}

func TestParseSchemaRelativeToDir(t *testing.T) {
	dir := t.TempDir()
	const schema = `{"type":"record","name":"X","fields":[{"name":"id","type":"string"}]}`
	if err := os.WriteFile(filepath.Join(dir, "x.avsc"), []byte(schema), 0o600); err != nil {
		t.Fatal(err)
	}
	src := edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    schema: x.avsc\n")
	ps, err := projection.Parse([]byte(src), dir)
	if err != nil {
		t.Fatal(err)
	}
	if ps[0].Schema != schema {
		t.Errorf("schema = %q, want the file's content", ps[0].Schema)
	}

	// A link that stays inside the directory is followed, as in a
	// Kubernetes ConfigMap volume (x.avsc -> ..data/x.avsc).
	if err := os.Mkdir(filepath.Join(dir, "..data"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "..data", "y.avsc"), []byte(schema), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "y.avsc"), filepath.Join(dir, "y.avsc")); err != nil {
		t.Fatal(err)
	}
	src = edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    schema: y.avsc\n")
	if ps, err = projection.Parse([]byte(src), dir); err != nil || ps[0].Schema != schema {
		t.Errorf("schema through a link inside the directory: %v", err)
	}
}

// TestParseSchemaStaysInsideAndUnquoted: a schema path leading out of the
// projection file's directory is refused, and no error quotes the file it
// names, whatever that file holds.
func TestParseSchemaStaysInsideAndUnquoted(t *testing.T) {
	const secret = "s3cr3t-do-not-print"
	outside := t.TempDir()
	outsideFile := filepath.Join(outside, "passwd")
	if err := os.WriteFile(outsideFile, []byte("root:x:0:0:"+secret+":/root:/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("passwd.avsc", "root:x:0:0:"+secret+":/root:/bin/sh\n")
	write("string.avsc", `"`+secret+`"`)
	write("unknown.avsc", `{"type":"record","name":"X","fields":[{"name":"id","type":"`+secret+`"}]}`)
	write("int.avsc", `"int"`)
	write("broken.avsc", "{\n  \"type\": \"record\",\n  "+secret+"\n}")
	if err := os.Symlink(outsideFile, filepath.Join(dir, "link.avsc")); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, outsideFile)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, path, want string }{
		{"absolute path", outsideFile, "inside"},
		{"path up and out", rel, "inside"},
		{"symbolic link out", "link.avsc", "link.avsc"},
		{"not JSON", "passwd.avsc", "line 1, column 1"},
		{"not JSON further in", "broken.avsc", "line 3, column 3"},
		{"a JSON string", "string.avsc", "line 1, column 1: a type that is neither"},
		{"an unknown Avro type", "unknown.avsc", "line 1, column 59: a type that is neither"},
		{"an Avro schema that is not a record", "int.avsc", "line 1, column 1: want a JSON object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    schema: '"+tc.path+"'\n")
			ps, err := projection.Parse([]byte(src), dir)
			if err == nil {
				t.Fatalf("Parse accepted schema %s (schema %q)", tc.path, ps[0].Schema)
			}
			for _, w := range []string{`projection "p1"`, "schema", tc.path, tc.want} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "root:x") {
				t.Errorf("error %q quotes the file's content", err)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, demo.Projections, 0o600); err != nil {
		t.Fatal(err)
	}
	ps, err := projection.Load(good)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if len(ps) != 1 || ps[0].Name != "accounts" {
		t.Errorf("Load gave %v, want the accounts projection", ps)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(edit(t, baseYAML, "    topic: t1\n", "")), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = projection.Load(bad)
	if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), `projection "p1"`) {
		t.Errorf("Load(bad) error = %v, want it to name the file and the projection", err)
	}
	if _, err := projection.Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}

func TestValidateCodeProjection(t *testing.T) {
	fold := func(projection.Row, projection.Event) (projection.Row, error) { return nil, nil }
	valid := func() *projection.Projection {
		return &projection.Projection{
			Name: "code", Topic: "t", Table: "code", KeyField: "id", KeyColumn: "id", VersionField: "version",
			Mode: projection.ModeFold, OnGap: projection.GapHold, Fold: fold,
			Columns: []projection.Column{{Name: "id", Type: "text", PrimaryKey: true}, {Name: "v", Type: "bigint"}},
		}
	}
	if err := valid().Validate(); err != nil {
		t.Fatalf("valid code projection: %v", err)
	}
	// Type names as Postgres prints them; whether they name a type only
	// Postgres can tell (postgres.Migrate asks it).
	for _, typ := range []string{"timestamp(3) with time zone", "public.citext", `"Mixed Case".t`, "character varying(12)[]", "interval day to second(3)"} {
		p := valid()
		p.Columns[1].Type = typ
		if err := p.Validate(); err != nil {
			t.Errorf("Validate refused type %q: %v", typ, err)
		}
	}
	// What a file may leave out, a projection defined in Go may too.
	zero := valid()
	zero.KeyColumn, zero.VersionField, zero.Mode, zero.OnGap = "", "", "", ""
	if err := zero.Validate(); err != nil {
		t.Fatalf("code projection with zero key column, version field, mode and on_gap: %v", err)
	}
	if zero.KeyColumn != "id" || zero.VersionField != "version" || zero.Mode != projection.ModeFold || zero.OnGap != projection.GapHold || zero.GapTimeout != projection.DefaultGapTimeout {
		t.Errorf("defaults: key column %q, version field %q, mode %q, on_gap %q, gap timeout %v; want id, version, fold, hold, %v",
			zero.KeyColumn, zero.VersionField, zero.Mode, zero.OnGap, zero.GapTimeout, projection.DefaultGapTimeout)
	}
	cases := []struct {
		name   string
		mutate func(p *projection.Projection)
		want   string
	}{
		{"no fold", func(p *projection.Projection) { p.Fold = nil }, "no fold"},
		{"key not first", func(p *projection.Projection) { p.Columns[0], p.Columns[1] = p.Columns[1], p.Columns[0] }, `column "id"`},
		{"no table", func(p *projection.Projection) { p.Table = "" }, "table"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := valid()
			tc.mutate(p)
			err := p.Validate()
			if err == nil || !strings.Contains(err.Error(), `projection "code"`) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want an error naming the projection and %q", err, tc.want)
			}
		})
	}
}

// TestParseLiterals: {literal: v} adds or sets a constant whatever the
// event holds, and a bare YAML number under set stays a literal as the
// projection file's documentation says.
func TestParseLiterals(t *testing.T) {
	src := edit(t, baseYAML, "      Created: {set: {name: name}}\n", `      Created: {set: {name: {literal: opened}, flag: {literal: true}, score: 1.5}, add: {n: {literal: 5}}}
      Bumped: {add: {n: {literal: -2}}, set: {score: {literal: 7}}}
`)
	src = edit(t, src, "      n: {type: bigint}\n", "      n: {type: bigint, default: 10}\n      flag: {type: boolean}\n      score: {type: double precision}\n")
	ps, err := projection.Parse([]byte(src), ".")
	if err != nil {
		t.Fatal(err)
	}
	p := ps[0]
	if got := p.ReadFields(); !slices.Equal(got, []string{"id", "type", "version"}) {
		t.Errorf("read fields = %v: a literal is no field to decode", got)
	}
	row, err := p.Apply(nil, projection.Event{Key: "a", Version: 1, Type: "Created", Fields: map[string]any{"id": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	want := projection.Row{"id": "a", "name": "opened", "n": int64(15), "flag": true, "score": 1.5}
	if !reflect.DeepEqual(row, want) {
		t.Errorf("after Created: %v, want %v", row, want)
	}
	row, err = p.Apply(row, projection.Event{Key: "a", Version: 2, Type: "Bumped", Fields: map[string]any{"id": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	want = projection.Row{"id": "a", "name": "opened", "n": int64(13), "flag": true, "score": 7.0}
	if !reflect.DeepEqual(row, want) {
		t.Errorf("after Bumped: %v, want %v", row, want)
	}
}

func TestParseFilterableAndTenant(t *testing.T) {
	ps, err := projection.Parse([]byte(edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    filterable: [name, n]\n    tenant: name\n")), ".")
	if err != nil {
		t.Fatal(err)
	}
	if got := ps[0].Filterable; !slices.Equal(got, []string{"name", "n"}) {
		t.Errorf("filterable = %q, want [name n]", got)
	}
	if ps[0].Tenant != "name" {
		t.Errorf("tenant = %q, want name", ps[0].Tenant)
	}
	// How the read API reads the table is the deployment's, not the
	// definition's: changing it asks for no rebuild.
	d, err := ps[0].Definition()
	if err != nil {
		t.Fatal(err)
	}
	plain, err := projection.Parse([]byte(baseYAML), ".")
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := plain[0].Definition()
	if bytes.Contains(d.YAML, []byte("filterable")) || bytes.Contains(d.YAML, []byte("tenant")) {
		t.Errorf("the definition holds the read API's keys, which would change the stored definitions' hashes:\n%s", d.YAML)
	}
	if !d.Equal(pd) {
		t.Errorf("filterable and tenant changed the definition:\n%s\nvs\n%s", d.YAML, pd.YAML)
	}
	back, err := d.Compile(ps[0])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back.Filterable, ps[0].Filterable) || back.Tenant != "name" {
		t.Errorf("compiled from the definition: filterable %q tenant %q, want the running file's", back.Filterable, back.Tenant)
	}
}
