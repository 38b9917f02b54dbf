package readapi_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/jackc/pgx/v5"

	"github.com/projector-dev/projector/auth"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/readapi"
)

var update = flag.Bool("update", false, "rewrite openapi.json from examples/projections.yaml")

// TestOpenAPIDocument keeps the committed document, that of the example
// projection file as serve and run --api serve it (the admin API
// beside), current, and checks it is a valid OpenAPI 3.1 document.
func TestOpenAPIDocument(t *testing.T) {
	example := filepath.Join("..", "examples", "projections.yaml")
	src, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := projection.Parse(src, filepath.Dir(example))
	if err != nil {
		t.Fatal(err)
	}
	got, err := readapi.Document(ps, readapi.WithAdmin())
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile("openapi.json", got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("readapi/openapi.json is not the document of examples/projections.yaml: run go test ./readapi -run TestOpenAPIDocument -update")
	}
	doc, err := openapi3.NewLoader().LoadFromData(got)
	if err != nil {
		t.Fatal(err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Errorf("openapi %q, want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Errorf("the document is not valid: %v", err)
	}
}

// typesYAML has a column of each kind the API writes, a tenant and
// filters; ghosts loses its table to answer 503.
const typesYAML = `projections:
  - name: things
    topic: things
    table: things
    key: id
    mode: snapshot
    filterable: [label, qty, active, day]
    tenant: org
    columns:
      id: {type: bigint, primary_key: true}
      org: {type: text}
      label: {type: varchar(20)}
      qty: {type: integer}
      ratio: {type: double precision}
      price: {type: "numeric(10,2)"}
      active: {type: boolean}
      at: {type: timestamptz(3)}
      wall: {type: timestamp}
      day: {type: date}
      raw: {type: bytea}
      doc: {type: jsonb}
      tags: {type: "text[]"}
      grid: {type: "integer[]"}
      uid: {type: uuid}
  - name: order_lines
    topic: order-lines
    table: order_lines
    key: id
    mode: snapshot
    columns:
      id: {type: text, primary_key: true}
      note: {type: text}
  - name: ghosts
    topic: ghosts
    table: ghosts
    key: id
    mode: snapshot
    columns:
      id: {type: text, primary_key: true}
`

// contract validates requests and responses against the served document.
type contract struct {
	b       *bundle
	router  routers.Router
	covered map[string]bool // "METHOD path status" seen
}

func newContract(t *testing.T, b *bundle) *contract {
	t.Helper()
	resp, err := b.srv.Client().Get(b.srv.URL + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /openapi.json without a token: status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	doc, err := openapi3.NewLoader().LoadFromData(body)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Fatalf("the served document is not valid: %v", err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &contract{b: b, router: router, covered: map[string]bool{}}
}

// bearer is the document's security scheme as the API checks it: a
// request without a bearer token is not one the document allows.
func bearer(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	if !strings.HasPrefix(in.RequestValidationInput.Request.Header.Get("Authorization"), "Bearer ") {
		return errors.New("no bearer token")
	}
	return nil
}

// call sends method path with header pairs, checks the request is valid
// by the document exactly when valid says so, and checks the response
// (status documented, headers, content type and body) whatever the
// request was. It returns the response.
func (c *contract) call(t *testing.T, valid bool, method, path string, header ...string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, c.b.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		t.Fatalf("%s %s: no route in the document: %v", method, path, err)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: bearer, MultiError: true}}
	reqErr := openapi3filter.ValidateRequest(t.Context(), in)
	if valid && reqErr != nil {
		t.Errorf("%s %s: a valid request the document refuses: %v", method, path, reqErr)
	}
	if !valid && reqErr == nil {
		t.Errorf("%s %s: an invalid request the document allows", method, path)
	}
	resp, err := c.b.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	err = openapi3filter.ValidateResponse(t.Context(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Body:    io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	})
	if err != nil {
		t.Errorf("%s %s: status %d: the response does not match the document: %v\n%s", method, path, resp.StatusCode, err, body)
	}
	c.covered[fmt.Sprintf("%s %s %d", method, route.Path, resp.StatusCode)] = true
	return response{resp.StatusCode, resp.Header, body}
}

// TestOpenAPIContract sends each route valid and invalid requests, over a
// table with a value of every kind, and checks every request and
// response against the document the API serves.
func TestOpenAPIContract(t *testing.T) {
	f := &fakeFreshness{staleFor: 1500 * time.Millisecond, reach: func(key string, min int64) error {
		switch {
		case key == "busy":
			return readapi.ErrTooManyWaiters
		case min > 5:
			return fmt.Errorf("at 2: %w", readapi.ErrVersionNotReached)
		}
		return nil
	}}
	b := setup(t, typesYAML, readapi.Config{Staleness: f, Waiter: f})
	b.exec(t, `INSERT INTO things VALUES
		(1, 'acme', 'one', 1, 0.5, 12.50, true, '2024-05-17 09:30:15.1+00', '2024-05-17 09:30:15.5', '2024-05-17', '\x00ff10', '{"a":[1,null]}', '{a,NULL}', '{{1,2},{3,4}}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 2),
		(2, 'acme', 'two', 2, 'NaN', 'NaN', false, 'infinity', '-infinity', '-infinity', '', 'null', '{}', '{}', NULL, 1),
		(3, 'globex', NULL, NULL, '-Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1),
		(9007199254740993, 'acme', 'big', -2147483648, 1e308, -0.01, true, '0001-01-01 00:00:00+00', '294276-12-31 23:59:59.999999', '4713-01-01 BC', '\x', '"s"', '{"with space","{braces}"}', '{NULL}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12', 7)`)
	b.exec(t, `INSERT INTO order_lines VALUES ('a/b', 'slash', 1), ('x', NULL, 1)`)
	b.exec(t, `DROP TABLE ghosts`)
	c := newContract(t, b)

	tok := func(token string) []string { return []string{"Authorization", "Bearer " + token} }
	all, acme, other := tok("all"), tok("acme-things"), tok("other")
	testTokens["acme-things"] = auth.Principal{Subject: "acme-things", Scopes: []string{auth.ReadScope("things")}, Tenant: "acme"}
	defer delete(testTokens, "acme-things")

	for _, method := range []string{http.MethodGet, http.MethodHead} {
		row := "/v1/projections/things/rows/"
		for _, key := range []string{"1", "2", "3", "9007199254740993"} {
			if r := c.call(t, true, method, row+key, all...); r.status != http.StatusOK {
				t.Errorf("%s %s: status %d", method, row+key, r.status)
			}
		}
		c.call(t, true, method, row+"1", append(all, "If-None-Match", `"2"`)...)
		c.call(t, true, method, row+"404", all...)
		c.call(t, true, method, row+"abc", all...)
		c.call(t, true, method, row+"3", acme...) // another tenant's row: 404
		c.call(t, true, method, row+"1?min_version=2&wait=1s", all...)
		c.call(t, true, method, row+"1", append(all, "Projector-Min-Version", "2")...)
		c.call(t, true, method, row+"1?min_version=6&wait=0.5", all...)
		c.call(t, true, method, row+"1?min_version=6&stale=ok", all...)
		c.call(t, true, method, row+"404?min_version=6", all...)
		c.call(t, true, method, row+"busy?min_version=1", all...)
		c.call(t, false, method, row+"1?min_version=0", all...)
		c.call(t, false, method, row+"1?min_version=x", all...)
		c.call(t, false, method, row+"1?min_version=1&stale=yes", all...)
		c.call(t, false, method, row+"1?min_version=1&wait=forever", all...)
		c.call(t, false, method, row+"1?min_version=1&wait=31s", all...)
		c.call(t, false, method, row+"1?min_version=1&wait=1m", all...)
		c.call(t, true, method, row+"1?min_version=1&wait=250ms", all...)
		c.call(t, true, method, row+"1?stale=ok", all...)
		c.call(t, true, method, row+"1?colour=red", all...)
		c.call(t, false, method, row+"1")
		c.call(t, true, method, row+"1", tok("forged")...)
		c.call(t, true, method, row+"1", other...)
		c.call(t, true, method, "/v1/projections/order_lines/rows/a%2Fb", all...)
		c.call(t, true, method, "/v1/projections/order_lines/rows/x", all...)
		c.call(t, true, method, "/v1/projections/ghosts/rows/x", all...)

		list := "/v1/projections/things/rows"
		r := c.call(t, true, method, list+"?limit=2", all...)
		if method == http.MethodGet {
			next, _ := r.json(t)["next"].(string)
			if next == "" {
				t.Fatalf("a page of 2 of 4 rows without a next link: %s", r.body)
			}
			c.call(t, true, method, next, all...)
		}
		c.call(t, true, method, list, acme...)
		c.call(t, true, method, list+"?label=one&qty=1", all...)
		c.call(t, false, method, list+"?qty=x", all...)
		c.call(t, false, method, list+"?qty=2147483648", all...)
		c.call(t, false, method, list+"?active=yes", all...)
		c.call(t, true, method, list+"?active=true&day=2024-05-17", all...)
		c.call(t, true, method, list+"?org=acme", all...) // not filterable: OpenAPI cannot refuse an unknown parameter; the API answers 400

		c.call(t, true, method, list+"?after=bm9wZQ", all...)
		c.call(t, false, method, list+"?limit=0", all...)
		c.call(t, false, method, list+"?limit=1001", all...)
		c.call(t, true, method, list+"?limit=1&limit=2", all...)
		c.call(t, true, method, list+"?min_version=1", all...)
		c.call(t, false, method, list)
		c.call(t, true, method, list, other...)
		c.call(t, true, method, "/v1/projections/order_lines/rows", all...)
		c.call(t, true, method, "/v1/projections/ghosts/rows", all...)
		c.call(t, true, method, "/openapi.json")
	}

	// Every operation and every status the document gives a route has
	// been met, so that no part of the document goes unchecked.
	for _, want := range []string{
		"GET /v1/projections/things/rows/{key} 200", "GET /v1/projections/things/rows/{key} 304",
		"GET /v1/projections/things/rows/{key} 400", "GET /v1/projections/things/rows/{key} 401",
		"GET /v1/projections/things/rows/{key} 403", "GET /v1/projections/things/rows/{key} 404",
		"GET /v1/projections/things/rows/{key} 412", "GET /v1/projections/things/rows/{key} 429",
		"GET /v1/projections/ghosts/rows/{key} 503",
		"GET /v1/projections/things/rows 200", "GET /v1/projections/things/rows 400",
		"GET /v1/projections/things/rows 401", "GET /v1/projections/things/rows 403",
		"GET /v1/projections/ghosts/rows 503",
		"HEAD /v1/projections/things/rows/{key} 200", "HEAD /v1/projections/things/rows 200",
		"GET /openapi.json 200", "HEAD /openapi.json 200",
	} {
		if !c.covered[want] {
			t.Errorf("never met: %s", want)
		}
	}
}

// TestOpenAPIRoutes fails on a route the API serves that its document
// does not describe.
func TestOpenAPIRoutes(t *testing.T) {
	ps, err := projection.Parse([]byte(typesYAML), ".")
	if err != nil {
		t.Fatal(err)
	}
	api, err := readapi.New(readapi.Config{Projections: ps, DB: noDB{}, Authenticator: testTokens})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := readapi.Document(ps)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		t.Fatal(err)
	}
	routes := api.Routes()
	if len(routes) == 0 {
		t.Fatal("the API lists no routes")
	}
	for _, pattern := range routes {
		paths := []string{pattern}
		if strings.Contains(pattern, "{name}") {
			paths = nil
			for _, p := range ps {
				paths = append(paths, strings.ReplaceAll(pattern, "{name}", p.Name))
			}
		}
		for _, path := range paths {
			item := doc.Paths.Value(path)
			if item == nil {
				t.Errorf("route %s: %s is not in the document", pattern, path)
				continue
			}
			if item.Get == nil {
				t.Errorf("route %s: %s has no GET in the document", pattern, path)
			}
			if item.Head == nil {
				t.Errorf("route %s: %s has no HEAD in the document", pattern, path)
			}
		}
	}
	if got, want := doc.Paths.Len(), 1+2*len(ps); got != want {
		t.Errorf("the document has %d paths, want %d: one per route and projection", got, want)
	}
}

// noDB is a Querier never called: the routes are listed without a query.
type noDB struct{}

func (noDB) Query(context.Context, string, ...any) (pgx.Rows, error) { panic("no query expected") }
