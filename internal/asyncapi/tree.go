package asyncapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// A document is built from these values, written as YAML or JSON with
// their keys in the order they were added: obj (an ordered mapping),
// []any, string, int, bool, json.Number and nil.

// obj is a mapping that keeps its keys in order.
type obj []pair

type pair struct {
	key string
	val any
}

// with returns o with key set to val at its end.
func (o obj) with(key string, val any) obj { return append(o, pair{key, val}) }

// get returns the value of key, nil when it is absent.
func (o obj) get(key string) any {
	for _, p := range o {
		if p.key == key {
			return p.val
		}
	}
	return nil
}

// yamlNode is v as a YAML node in block style.
func yamlNode(v any) (*yaml.Node, error) {
	switch v := v.(type) {
	case obj:
		n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		for _, p := range v {
			val, err := yamlNode(p.val)
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: p.key}, val)
		}
		return n, nil
	case []any:
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, e := range v {
			en, err := yamlNode(e)
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, en)
		}
		return n, nil
	case string:
		// The encoder quotes a string that would read as another type.
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v}, nil
	case int:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(v)}, nil
	case json.Number:
		tag := "!!int"
		if _, err := v.Int64(); err != nil {
			tag = "!!float"
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: v.String()}, nil
	case bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(v)}, nil
	case nil:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}, nil
	}
	return nil, fmt.Errorf("asyncapi: no form for a %T", v)
}

// writeYAML writes v as a YAML document.
func writeYAML(w io.Writer, v any) error {
	n, err := yamlNode(v)
	if err != nil {
		return err
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(n); err != nil {
		return err
	}
	return enc.Close()
}

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	if err := appendJSON(&buf, v); err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, buf.Bytes(), "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err := out.WriteTo(w)
	return err
}

func appendJSON(buf *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case obj:
		buf.WriteByte('{')
		for i, p := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			k, _ := json.Marshal(p.key)
			buf.Write(k)
			buf.WriteByte(':')
			if err := appendJSON(buf, p.val); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
		return nil
	case []any:
		buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := appendJSON(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
		return nil
	case string, int, json.Number, bool, nil:
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		buf.Write(b)
		return nil
	}
	return fmt.Errorf("asyncapi: no form for a %T", v)
}

// parseJSON reads a JSON text (an Avro schema) into the values above,
// keeping its keys in the order it writes them, so that the document
// shows a schema as its author wrote it.
func parseJSON(text string) (any, error) {
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	dec.UseNumber()
	v, err := parseValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("text after the JSON value")
	}
	return v, nil
}

func parseValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			o := obj{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := parseValue(dec)
				if err != nil {
					return nil, err
				}
				o = o.with(kt.(string), v)
			}
			_, err := dec.Token() // }
			return o, err
		case '[':
			a := []any{}
			for dec.More() {
				v, err := parseValue(dec)
				if err != nil {
					return nil, err
				}
				a = append(a, v)
			}
			_, err := dec.Token() // ]
			return a, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case string, json.Number, bool, nil:
		return t, nil
	}
	return nil, fmt.Errorf("unexpected %v", tok)
}
