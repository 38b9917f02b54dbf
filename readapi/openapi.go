package readapi

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/projector-dev/projector/projection"
)

// routeOpenAPI serves the document, unauthenticated: it describes the
// shapes of the rows and errors, which the projection file deployed
// already says, and holds no row, version or tenant, so it gives nothing
// a token guards; clients generate their code from it before they hold
// a token.
const routeOpenAPI = "/openapi.json"

// problemCodes are every problem's code, in the document's enum.
var problemCodes = []string{
	CodeNotFound, CodeBadFilter, CodeBadParameter, CodeBadCursor, CodeBodyNotAllowed,
	CodeVersionNotReached, CodeMinVersionNotHere, CodeTooManyWaiters, CodeUnauthenticated,
	CodeForbidden, CodeMethodNotAllowed, CodeTimeout, CodeUnavailable, CodeInternal,
}

// obj is a JSON object of the document.
type obj = map[string]any

// DocumentOption changes what Document describes.
type DocumentOption func(*documentOptions)

type documentOptions struct{ admin bool }

// WithAdmin describes the admin API too, for a process that serves it
// beside the read API: the document describes exactly what is served.
func WithAdmin() DocumentOption { return func(o *documentOptions) { o.admin = true } }

// Document returns the OpenAPI 3.1 document of the API serving projs: a
// row route and a list route for each projection, with its row's schema
// made from its columns' declared types as the API writes them; with
// WithAdmin, the admin API's routes as well.
func Document(projs []*projection.Projection, opts ...DocumentOption) ([]byte, error) {
	var o documentOptions
	for _, opt := range opts {
		opt(&o)
	}
	docOp := func(method string) obj {
		ok := obj{"description": "The OpenAPI document of this deployment's projections."}
		if method == "get" {
			ok["content"] = obj{"application/json": obj{"schema": obj{"type": "object"}}}
		}
		return obj{
			"operationId": method + "OpenAPI",
			"summary":     "This document, without a token: it describes shapes, never data.",
			"security":    []any{},
			"responses":   obj{"200": ok},
		}
	}
	paths := obj{routeOpenAPI: obj{"get": docOp("get"), "head": docOp("head")}}
	codes := problemCodes
	if o.admin {
		codes = append(slices.Clone(problemCodes), adminProblemCodes...)
	}
	schemas := obj{"Problem": problemSchema(codes)}
	sorted := slices.Clone(projs)
	slices.SortFunc(sorted, func(a, b *projection.Projection) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range sorted {
		id := schemaName(p.Name)
		row, err := rowSchema(p)
		if err != nil {
			return nil, err
		}
		schemas[id+"Row"] = row
		schemas[id+"Page"] = obj{
			"type":                 "object",
			"required":             []string{"rows", "next"},
			"additionalProperties": false,
			"properties": obj{
				"rows": obj{"type": "array", "maxItems": MaxLimit, "items": ref(id + "Row")},
				"next": obj{"type": []string{"string", "null"}, "description": "The link to the following page, null on the last page."},
			},
		}
		base := "/v1/projections/" + p.Name + "/rows"
		rowOp := rowOperation(p, id)
		listOp, err := listOperation(p, id)
		if err != nil {
			return nil, err
		}
		paths[base+"/{key}"] = obj{"get": rowOp("get"), "head": rowOp("head")}
		paths[base] = obj{"get": listOp("get"), "head": listOp("head")}
	}
	scopes := "read:<projection> or read:*"
	if o.admin {
		addAdmin(paths, schemas)
		scopes += "; the admin routes (under /admin/v1/) need scope admin"
	}
	doc := obj{
		"openapi": "3.1.0",
		"info": obj{
			"title":       "projector read API",
			"version":     "1",
			"description": "Rows of the projections, by key or in key order. Errors are RFC 9457 problem details with a stable code.",
		},
		"servers":  []any{obj{"url": "/"}},
		"security": []any{obj{"bearer": []any{}}},
		"paths":    paths,
		"components": obj{
			"schemas": schemas,
			"securitySchemes": obj{"bearer": obj{
				"type": "http", "scheme": "bearer",
				"description": "A token of the token file, or a JWT, with scope " + scopes + ".",
			}},
			"responses": problemResponses(o.admin),
		},
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("readapi: write the OpenAPI document: %w", err)
	}
	return append(b, '\n'), nil
}

// schemaName is a projection's name as a schema name: order_lines →
// OrderLines.
func schemaName(name string) string {
	var b strings.Builder
	for part := range strings.FieldsFuncSeq(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) {
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String()
}

func ref(schema string) obj { return obj{"$ref": "#/components/schemas/" + schema} }

func problemSchema(codes []string) obj {
	return obj{
		"type":        "object",
		"description": "An RFC 9457 problem details object; branch on code.",
		"required":    []string{"type", "title", "status", "code"},
		"properties": obj{
			"type":            obj{"type": "string", "format": "uri"},
			"title":           obj{"type": "string"},
			"status":          obj{"type": "integer", "minimum": 400, "maximum": 599},
			"detail":          obj{"type": "string"},
			"code":            obj{"type": "string", "enum": codes},
			"current_version": obj{"type": "integer", "description": "version_not_reached: the aggregate's version when the wait ended; absent when no row is visible."},
			"filterable":      obj{"type": "array", "items": obj{"type": "string"}, "description": "bad_filter: the columns a list may filter on."},
		},
	}
}

// problemResponses are the error responses, by status.
func problemResponses(admin bool) obj {
	out := obj{}
	statuses := []int{400, 401, 403, 404, 412, 429, 503}
	if admin {
		statuses = append(statuses, 409, 413, 500, 501)
	}
	for _, s := range statuses {
		r := obj{
			"description": http.StatusText(s),
			"headers":     obj{"Cache-Control": obj{"schema": obj{"type": "string", "const": "no-store"}}},
			"content":     obj{problemContentType: obj{"schema": ref("Problem")}},
		}
		switch s {
		case 401:
			r["headers"].(obj)["WWW-Authenticate"] = obj{"required": true, "schema": obj{"type": "string"}}
		case 429:
			r["headers"].(obj)["Retry-After"] = obj{"required": true, "schema": obj{"type": "integer", "minimum": 0}}
		}
		out[strconv.Itoa(s)] = r
	}
	return out
}

func problemRef(s int) obj { return obj{"$ref": "#/components/responses/" + strconv.Itoa(s)} }

var stalenessHeader = obj{
	"description": "How far behind its events the table is, in seconds; 0 when caught up.",
	"schema":      obj{"type": "number", "minimum": 0},
}

// rowOperation returns the row route's operation of a method.
func rowOperation(p *projection.Projection, id string) func(method string) obj {
	return func(method string) obj {
		rowHeaders := obj{
			"ETag":          obj{"required": true, "schema": obj{"type": "string", "pattern": `^"[0-9]+"$`}},
			headerVersion:   obj{"required": true, "schema": obj{"type": "integer"}},
			headerStaleness: stalenessHeader,
			headerStale:     obj{"schema": obj{"type": "string", "const": "true"}},
			"Cache-Control": obj{"schema": obj{"type": "string"}},
		}
		ok := obj{"description": "The row.", "headers": rowHeaders}
		if method == "get" {
			ok["content"] = obj{"application/json": obj{"schema": ref(id + "Row")}}
		}
		return obj{
			"operationId": method + id + "Row",
			"summary":     fmt.Sprintf("The row of projection %s of an aggregate key.", p.Name),
			"parameters": []any{
				obj{"name": "key", "in": "path", "required": true, "schema": obj{"type": "string"},
					"description": "The aggregate key, in its column's text form."},
				obj{"name": "min_version", "in": "query", "schema": versionSchema,
					"description": "Wait until the aggregate has reached this version."},
				obj{"name": "wait", "in": "query", "schema": obj{"type": "string", "pattern": WaitPattern},
					"description": "How long min_version waits: seconds (2.5), or in s or ms (2s, 500ms); at most 30s (default 5s)."},
				obj{"name": "stale", "in": "query", "schema": obj{"type": "string", "enum": []string{"ok"}},
					"description": "With min_version: answer the current row when the wait runs out."},
				obj{"name": headerMinVersion, "in": "header", "schema": versionSchema,
					"description": "min_version, as a header."},
				obj{"name": "If-None-Match", "in": "header", "schema": obj{"type": "string"}},
			},
			"responses": obj{
				"200": ok,
				"304": obj{"description": "The row has not changed.", "headers": rowHeaders},
				"400": problemRef(400), "401": problemRef(401), "403": problemRef(403),
				"404": problemRef(404), "412": problemRef(412), "429": problemRef(429), "503": problemRef(503),
			},
		}
	}
}

// listOperation returns the list route's operation of a method.
func listOperation(p *projection.Projection, id string) (func(method string) obj, error) {
	params := []any{
		obj{"name": "limit", "in": "query", "schema": obj{"type": "integer", "minimum": 1, "maximum": MaxLimit, "default": DefaultLimit}},
		obj{"name": "after", "in": "query", "schema": obj{"type": "string", "pattern": "^[A-Za-z0-9_-]+$"},
			"description": "The opaque cursor of a next link: pass the link as it is."},
	}
	types := map[string]string{}
	for _, c := range p.Columns {
		types[c.Name] = c.Type
	}
	for _, c := range slices.Sorted(slices.Values(p.Filterable)) {
		params = append(params, obj{"name": c, "in": "query", "schema": filterSchema(types[c]),
			"description": fmt.Sprintf("Equality filter on column %s (%s).", c, types[c])})
	}
	return func(method string) obj {
		ok := obj{"description": "A page of rows in key order.", "headers": obj{
			headerStaleness: stalenessHeader,
			"Link":          obj{"description": `The next page, rel="next".`, "schema": obj{"type": "string"}},
			"Cache-Control": obj{"schema": obj{"type": "string"}},
		}}
		if method == "get" {
			ok["content"] = obj{"application/json": obj{"schema": ref(id + "Page")}}
		}
		return obj{
			"operationId": method + id + "Rows",
			"summary":     fmt.Sprintf("Rows of projection %s in key order.", p.Name),
			"parameters":  params,
			"responses": obj{
				"200": ok, "400": problemRef(400), "401": problemRef(401), "403": problemRef(403), "503": problemRef(503),
			},
		}
	}, nil
}

// rowSchema is the JSON schema of p's rows, by docs/api.md's mapping of
// the columns' types.
func rowSchema(p *projection.Projection) (obj, error) {
	props := obj{}
	required := make([]string, 0, len(p.Columns)+1)
	for _, c := range p.Columns {
		base, array := projection.CanonicalType(c.Type)
		s := valueSchema(base, c.Type)
		if array {
			// Elements may be NULL, and an array may hold arrays
			// (two or more dimensions).
			s = obj{"type": "array", "items": obj{"anyOf": []any{s, obj{"type": "null"}, obj{"type": "array"}}}}
		}
		if !c.PrimaryKey {
			s = obj{"anyOf": []any{s, obj{"type": "null"}}}
		}
		s["description"] = c.Type
		props[c.Name] = s
		required = append(required, c.Name)
	}
	props["version"] = obj{"type": "integer", "description": "The row's version."}
	required = append(required, "version")
	return obj{"type": "object", "required": required, "additionalProperties": false, "properties": props}, nil
}

// Patterns of the values written as strings.
const (
	patternNumeric = `^(-?[0-9]+(\.[0-9]+)?|NaN|-?Infinity)$`
	patternInstant = `-?[0-9]{4,}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}`
	patternDate    = `^(-?[0-9]{4,}-[0-9]{2}-[0-9]{2}|-?infinity)$`
)

// valueSchema is the schema of one value of a column of the type
// format_type names base, declared as declared.
func valueSchema(base, declared string) obj {
	switch kindOf(base) {
	case kindInt:
		return obj{"type": "integer"}
	case kindFloat:
		return obj{"anyOf": []any{obj{"type": "number"}, obj{"type": "string", "enum": []string{"NaN", "Infinity", "-Infinity"}}}}
	case kindBool:
		return obj{"type": "boolean"}
	case kindNumeric:
		return obj{"type": "string", "pattern": patternNumeric}
	case kindJSON:
		return obj{}
	case kindBytes:
		return obj{"type": "string", "contentEncoding": "base64"}
	case kindTimestamptz:
		return obj{"type": "string", "pattern": `^(` + patternInstant + fraction(declared) + `Z|-?infinity)$`}
	case kindTimestamp:
		return obj{"type": "string", "pattern": `^(` + patternInstant + fraction(declared) + `|-?infinity)$`}
	case kindDate:
		return obj{"type": "string", "pattern": patternDate}
	}
	return obj{"type": "string"}
}

var declaredPrecision = regexp.MustCompile(`\(\s*([0-6])\s*\)`)

// fraction is the pattern of the fractional seconds of a timestamp
// declared as declared: as many digits as a declared precision, else up
// to 6 (trailing zeros trimmed).
func fraction(declared string) string {
	m := declaredPrecision.FindStringSubmatch(declared)
	switch {
	case m == nil:
		return `(\.[0-9]{0,5}[1-9])?`
	case m[1] == "0":
		return ""
	}
	return `\.[0-9]{` + m[1] + `}`
}

// versionSchema is a version's: a positive bigint.
var versionSchema = obj{"type": "integer", "minimum": 1, "maximum": int64(math.MaxInt64)}

// filterSchema is the schema of a filter's value on a column of type
// declared: integers and booleans as the API checks them, the types
// written as strings in the pattern of their JSON, others any string
// (PostgreSQL judges them: one its type cannot hold is a 400).
func filterSchema(declared string) obj {
	base, array := projection.CanonicalType(declared)
	if array {
		return obj{"type": "string"}
	}
	switch kindOf(base) {
	case kindInt:
		bits := intBits(base)
		return obj{"type": "integer", "minimum": -(int64(1) << (bits - 1)), "maximum": int64(1)<<(bits-1) - 1}
	case kindBool:
		return obj{"type": "string", "enum": []string{"true", "false"}}
	case kindDate:
		return obj{"type": "string", "pattern": patternDateFilter}
	case kindTimestamptz:
		return obj{"type": "string", "pattern": `^` + dateFilter + `T` + timeFilter + `Z$`}
	case kindTimestamp:
		return obj{"type": "string", "pattern": `^` + dateFilter + `T` + timeFilter + `$`}
	case kindNumeric:
		return valueSchema(base, declared)
	}
	return obj{"type": "string"}
}

// A date or timestamp filter's value: a day of years 1 to 9999 in the
// form the API writes, each month with the days it has. February 29 is
// left out, as a pattern cannot tell leap years: the API takes it in a
// leap year, and PostgreSQL refuses it in others (400).
const (
	dateFilter        = `([0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))`
	timeFilter        = `([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?`
	patternDateFilter = `^(` + dateFilter + `|-?infinity)$`
)

// serveDocument answers GET /openapi.json.
func (a *API) serveDocument(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache")
	h.Set("Content-Length", strconv.Itoa(len(a.document)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(a.document)
	}
}
