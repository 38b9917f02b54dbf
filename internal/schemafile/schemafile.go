// Package schemafile parses Avro schema files (.avsc) given by people: a
// reader schema named in a projection file, or a writer schema given to
// produce or check. Its errors say where in the file the problem is (line
// and column) and what was expected, and never quote the file: a flag
// pointed at the wrong file (a password file, a key, /etc/passwd) must
// not print what that file holds.
package schemafile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/hamba/avro/v2"
)

// MaxSize is the largest schema file read: a schema is a few kilobytes,
// and a flag pointed at a large file (a disk image, a log) must not make
// a command read all of it into memory.
const MaxSize = 16 << 20

// ErrNotSchema is what every error about a file's content wraps.
var ErrNotSchema = errors.New("not an Avro schema")

// Error is a problem in a schema file: where it is and what is wrong,
// with nothing of the file's content.
type Error struct {
	Line, Column int    // 1-based
	Problem      string // what is wrong there, in the file's own terms
}

func (e *Error) Error() string {
	return fmt.Sprintf("line %d, column %d: %s; want an Avro schema in JSON, such as {\"type\": \"record\", \"name\": …, \"fields\": […]}",
		e.Line, e.Column, e.Problem)
}

func (e *Error) Unwrap() error { return ErrNotSchema }

// Read reads at most MaxSize bytes of r, a schema file's content, and
// parses them (see Parse).
func Read(r io.Reader) ([]byte, avro.Schema, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return nil, nil, err
	}
	if len(b) > MaxSize {
		return nil, nil, fmt.Errorf("%w: the file is larger than %d MiB, which no schema is", ErrNotSchema, MaxSize>>20)
	}
	s, err := Parse(b)
	return b, s, err
}

// Parse parses b as an Avro schema, with a schema cache of its own so
// that names it defines do not leak into other parses. Its errors are
// *Error.
func Parse(b []byte) (avro.Schema, error) {
	var top any
	if err := json.Unmarshal(b, &top); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			off := syn.Offset
			if errors.Is(err, io.ErrUnexpectedEOF) || strings.HasPrefix(syn.Error(), "unexpected end") {
				off = int64(len(b)) + 1 // where more was wanted
			}
			line, col := Position(b, off)
			return nil, &Error{Line: line, Column: col, Problem: "not JSON (" + syntaxProblem(syn) + ")"}
		}
		line, col := Position(b, firstByte(b))
		return nil, &Error{Line: line, Column: col, Problem: "not JSON"}
	}
	s, err := avro.ParseBytesWithCache(b, "", &avro.SchemaCache{})
	if err != nil {
		off := locate(b, err.Error())
		line, col := Position(b, off)
		return nil, &Error{Line: line, Column: col, Problem: avroProblem(err.Error())}
	}
	return s, nil
}

// Position returns the 1-based line and column of the byte at 1-based
// offset off in b (json.SyntaxError's Offset counts the bytes read up to
// and including the one refused); len(b)+1 is the end of b.
func Position(b []byte, off int64) (line, col int) {
	off = min(max(off, 1), int64(len(b))+1)
	before := b[:off-1]
	line = bytes.Count(before, []byte{'\n'}) + 1
	return line, len(before) - bytes.LastIndexByte(before, '\n')
}

// firstByte is the 1-based offset of b's first byte that is not white
// space: where its top-level value starts.
func firstByte(b []byte) int64 {
	return int64(len(b)-len(bytes.TrimLeft(b, " \t\r\n"))) + 1
}

// syntaxProblem is what the JSON decoder refused, without the character it
// quotes.
func syntaxProblem(e *json.SyntaxError) string {
	msg := e.Error()
	if rest, ok := strings.CutPrefix(msg, "invalid character "); ok {
		// invalid character 'x' looking for beginning of value
		if i := strings.Index(rest, "' "); i >= 0 {
			return "unexpected character " + rest[i+2:]
		}
		return "unexpected character"
	}
	if strings.HasPrefix(msg, "unexpected end of JSON input") {
		return "it ends too early"
	}
	return "syntax error"
}

// avroProblems are the problems the Avro parser reports, by a phrase of
// its message, in words that quote nothing: the parser's own messages
// quote the names it refuses, which here are the file's content.
var avroProblems = []struct{ phrase, problem string }{
	{"unknown type", "a type that is neither a primitive type, record, enum, array, map or fixed, nor a name defined before it"},
	{"record must have an array of fields", "a record without a fields array"},
	{"duplicate field name", "a field name used twice in one record"},
	{"field requires a type", "a field without a type"},
	{"array must have an items key", "an array without items"},
	{"map must have an values key", "a map without values"},
	{"fixed must have a size", "a fixed without a size"},
	{"fixed size cannot be negative", "a fixed with a negative size"},
	{"non-empty name key required", "a named type without a name"},
	{"duplicate name", "a name defined twice"},
	{"invalid name", "a name that is not an Avro name (letters, digits and _, not starting with a digit)"},
	{"enum must have a non-empty array of symbols", "an enum without symbols"},
	{"invalid symbol", "an enum symbol that is not an Avro name"},
	{"duplicate symbol", "an enum symbol used twice"},
	{"symbol default", "an enum default that is not one of its symbols"},
	{"union type cannot be a union", "a union inside a union"},
	{"union type must be unique", "a union with a type twice"},
	{"default", "a field default that does not fit its type"},
	{"order", "a field order other than ascending, descending or ignore"},
}

func avroProblem(msg string) string {
	for _, p := range avroProblems {
		if strings.Contains(msg, p.phrase) {
			return p.problem
		}
	}
	return "not a valid Avro schema: check its type names and attributes"
}

// locate returns the 1-based offset of the string value in b that msg,
// the parser's error, quotes: the longest one msg contains, else the first
// one, else the start of the top-level value. It reads b as JSON tokens,
// so only whole values count, never object keys.
func locate(b []byte, msg string) int64 {
	best, bestLen := firstByte(b), 0
	dec := json.NewDecoder(bytes.NewReader(b))
	// inObject[i] says whether the i-th open container is an object, and
	// key whether the next string in it is a key.
	var inObject []bool
	key := false
	prev := int64(0)
	for {
		tok, err := dec.Token()
		if err != nil {
			return best
		}
		start := prev
		for start < int64(len(b)) && bytes.IndexByte([]byte(" \t\r\n,:"), b[start]) >= 0 {
			start++
		}
		prev = dec.InputOffset()
		isKey := key
		if len(inObject) > 0 && inObject[len(inObject)-1] {
			key = !key
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				inObject = append(inObject, true)
				key = true
			case '[':
				inObject = append(inObject, false)
				key = false
			default:
				inObject = inObject[:len(inObject)-1]
				key = len(inObject) > 0 && inObject[len(inObject)-1]
			}
		case string:
			if !isKey && t != "" && len(t) > bestLen && strings.Contains(msg, t) {
				best, bestLen = start+1, len(t)
			}
		}
	}
}
