// Package jsonbody words the errors of decoding a request's JSON body for
// the HTTP APIs' answers.
package jsonbody

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// DecodeError words a decoding error, naming the unknown or mistyped field.
func DecodeError(err error) string {
	var typ *json.UnmarshalTypeError
	var syn *json.SyntaxError
	switch {
	case errors.As(err, &typ):
		return fmt.Sprintf("field %s: want a %s, found a JSON %s", typ.Field, typ.Type, typ.Value)
	case errors.As(err, &syn):
		return fmt.Sprintf("not JSON at byte %d: %v", syn.Offset, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "not JSON: it ends inside a value"
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return "unknown field " + name
	}
	return err.Error()
}
