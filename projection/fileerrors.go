package projection

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/projector-dev/projector/internal/redact"
)

// MaxNameLen is the longest name a projection file may hold where a name
// is expected (a projection, topic, table, column, field or event type):
// longer than any Postgres identifier (63 bytes) or Kafka topic (249),
// and short enough that an error quoting one stays short.
const MaxNameLen = 255

// freeText are the keys whose values are not names, and may be as long as
// their content needs: a column's default or a literal, a repair source's
// query and URLs, and the schema file's path.
var freeText = map[string]bool{"default": true, "literal": true, "query": true, "url": true, "database_url": true, "schema": true,
	// A topic has its own bound, MaxTopicLen, which CheckTopic enforces
	// with the topic clipped.
	"topic": true}

// checkNameLengths refuses a key, or a value where a name is expected,
// longer than MaxNameLen, by its line, column and length, without quoting
// it: a name pasted by mistake (a whole file, a megabyte of one
// character) must not come back whole in every error that names it.
func checkNameLengths(n *yaml.Node, key string) error {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for _, c := range n.Content {
			if err := checkNameLengths(c, key); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if len(k.Value) > MaxNameLen {
				return fmt.Errorf("line %d, column %d: a key of %d bytes: keys and names are at most %d bytes", k.Line, k.Column, len(k.Value), MaxNameLen)
			}
			if freeText[k.Value] {
				continue
			}
			if err := checkNameLengths(v, k.Value); err != nil {
				return err
			}
		}
	case yaml.ScalarNode:
		// A document that is one string is not a projection file at
		// all, which the decoder says.
		if key != "" && len(n.Value) > MaxNameLen {
			return fmt.Errorf("line %d, column %d: %s: a value of %d bytes where a name is wanted: names are at most %d bytes", n.Line, n.Column, redact.Clip(key), len(n.Value), MaxNameLen)
		}
	}
	return nil
}

// yamlError rewrites an error of the YAML decoder so that it says where
// (line and, where the document tells it, column) and what was wanted in
// the file's terms, and quotes no more of the file than a clipped name:
// the decoder's own messages quote values (the start of a string given
// where a list was wanted: the first line of a file that is not a
// projection file at all) and Go type names.
func yamlError(err error, root *yaml.Node) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		// A syntax error: its message is the parser's, which names a
		// line and no content.
		return fmt.Errorf("not YAML: %s", redact.ClipTo(strings.TrimPrefix(err.Error(), "yaml: "), 2*redact.MaxQuoted))
	}
	lines := make([]string, len(te.Errors))
	for i, e := range te.Errors {
		lines[i] = typeProblem(e, root)
	}
	if len(lines) == 1 {
		return errors.New(lines[0])
	}
	return fmt.Errorf("%d problems:\n  %s", len(lines), strings.Join(lines, "\n  "))
}

var (
	cannotRe  = regexp.MustCompile(`^line (\d+): cannot unmarshal (!!\w+)(?: .*)? into (.+)$`)
	unknownRe = regexp.MustCompile(`^line (\d+): field (.*) not found in type (.+)$`)
	twiceRe   = regexp.MustCompile(`^line (\d+): mapping key (".*") already defined at line (\d+)$`)
	lineRe    = regexp.MustCompile(`^line (\d+): (.*)$`)
)

// typeProblem rewrites one of the decoder's type errors, "line N: …".
func typeProblem(e string, root *yaml.Node) string {
	if m := cannotRe.FindStringSubmatch(e); m != nil {
		line, _ := strconv.Atoi(m[1])
		return fmt.Sprintf("%s: want %s, got %s", where(root, line, func(n *yaml.Node, isKey bool) bool { return !isKey && n.ShortTag() == m[2] }),
			goKind(m[3]), tagKind(m[2]))
	}
	if m := unknownRe.FindStringSubmatch(e); m != nil {
		line, _ := strconv.Atoi(m[1])
		want := ""
		if fields := yamlFields(m[3]); len(fields) > 0 {
			want = " (want " + strings.Join(fields, ", ") + ")"
		}
		return fmt.Sprintf("%s: unknown field %q%s", where(root, line, func(n *yaml.Node, isKey bool) bool { return isKey && n.Value == m[2] }),
			redact.Clip(m[2]), want)
	}
	if m := twiceRe.FindStringSubmatch(e); m != nil {
		line, _ := strconv.Atoi(m[1])
		key, _ := strconv.Unquote(m[2])
		return fmt.Sprintf("%s: key %q is given twice (first at line %s)", where(root, line, func(n *yaml.Node, isKey bool) bool { return isKey && n.Value == key }),
			redact.Clip(key), m[3])
	}
	if m := lineRe.FindStringSubmatch(e); m != nil {
		return "line " + m[1] + ": " + redact.ClipTo(m[2], 2*redact.MaxQuoted)
	}
	return redact.ClipTo(e, 2*redact.MaxQuoted)
}

// where is "line L, column C" of the first node on line that match
// accepts, followed by ": key" when the node is a key's value, or
// "line L" when no node matches.
func where(root *yaml.Node, line int, match func(n *yaml.Node, isKey bool) bool) string {
	var found, key *yaml.Node
	var walk func(n, k *yaml.Node, isKey bool)
	walk = func(n, k *yaml.Node, isKey bool) {
		if found != nil || n == nil {
			return
		}
		if n.Line == line && n.Kind != yaml.DocumentNode && match(n, isKey) {
			found, key = n, k
			return
		}
		for i, c := range n.Content {
			var ck *yaml.Node
			if n.Kind == yaml.MappingNode && i%2 == 1 {
				ck = n.Content[i-1]
			}
			walk(c, ck, n.Kind == yaml.MappingNode && i%2 == 0)
		}
	}
	walk(root, nil, false)
	switch {
	case found == nil:
		return fmt.Sprintf("line %d", line)
	case key != nil:
		return fmt.Sprintf("line %d, column %d: %s", line, found.Column, redact.Clip(key.Value))
	}
	return fmt.Sprintf("line %d, column %d", line, found.Column)
}

// tagKind names what a YAML tag holds.
func tagKind(tag string) string {
	switch tag {
	case "!!str":
		return "a string"
	case "!!int":
		return "an integer"
	case "!!float":
		return "a number"
	case "!!bool":
		return "true or false"
	case "!!null":
		return "nothing"
	case "!!seq":
		return "a list"
	case "!!map":
		return "a mapping"
	}
	return "a value of another kind"
}

// goKind names what a Go type the file decodes into wants.
func goKind(typ string) string {
	switch {
	case strings.HasPrefix(typ, "[]"):
		return "a list"
	case strings.HasPrefix(typ, "map["), strings.HasPrefix(typ, "*"), strings.HasPrefix(typ, "struct"), strings.Contains(typ, "."):
		if fields := yamlFields(typ); len(fields) > 0 {
			return "a mapping with " + strings.Join(fields, ", ")
		}
		return "a mapping"
	case typ == "string":
		return "a string"
	case typ == "bool":
		return "true or false"
	case strings.HasPrefix(typ, "int"), strings.HasPrefix(typ, "uint"):
		return "an integer"
	case strings.HasPrefix(typ, "float"):
		return "a number"
	}
	return "a value of another kind"
}

// fileTypes are the types of the projection file by their Go name, as the
// decoder's errors name them.
var fileTypes = func() map[string]reflect.Type {
	out := map[string]reflect.Type{}
	var add func(t reflect.Type)
	add = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || t == reflect.TypeFor[yaml.Node]() {
			return
		}
		if _, ok := out[t.String()]; ok {
			return
		}
		out[t.String()] = t
		for i := range t.NumField() {
			add(t.Field(i).Type)
		}
	}
	add(reflect.TypeFor[File]())
	return out
}()

// yamlFields lists the keys the file type typ (a Go type name) takes.
func yamlFields(typ string) []string {
	t, ok := fileTypes[strings.TrimPrefix(typ, "*")]
	if !ok {
		return nil
	}
	var fields []string
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); name != "" && name != "-" {
			fields = append(fields, name)
		}
	}
	return fields
}
