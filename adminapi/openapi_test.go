package adminapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/projector-dev/projector/adminapi"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/readapi"
	"github.com/projector-dev/projector/rebuild"
)

const accountsYAML = `projections:
  - name: accounts
    topic: accounts.events
    table: accounts
    key: account_id
    mode: snapshot
    columns:
      account_id: {type: text, primary_key: true}
      owner: {type: text}
`

// adminDocument is the document serve and run --api serve, admin routes
// included.
func adminDocument(t *testing.T) *openapi3.T {
	t.Helper()
	projs, err := projection.Parse([]byte(accountsYAML), "")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := readapi.Document(projs, readapi.WithAdmin())
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Fatalf("the document is not valid: %v", err)
	}
	return doc
}

// contract validates the admin API's requests and responses against the
// document.
type contract struct {
	router  routers.Router
	covered map[string]bool // "METHOD path status" seen
}

// bearer is the document's security scheme as the API checks it: a
// request without a bearer token is not one the document allows.
func bearer(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	if !strings.HasPrefix(in.RequestValidationInput.Request.Header.Get("Authorization"), "Bearer ") {
		return errors.New("no bearer token")
	}
	return nil
}

// call sends method path with body and token ("" for none) to f, checks
// the request is valid by the document exactly when valid says so, and
// checks the response (status documented, headers, content type and
// body) whatever the request was. It returns the status.
func (c *contract) call(t *testing.T, f fixture, valid bool, token, method, path, body string) int {
	t.Helper()
	newReq := func() *http.Request {
		req, err := http.NewRequestWithContext(t.Context(), method, f.url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		return req
	}
	req := newReq()
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		t.Fatalf("%s %s: no route in the document: %v", method, path, err)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: bearer, MultiError: true}}
	reqErr := openapi3filter.ValidateRequest(t.Context(), in)
	if valid && reqErr != nil {
		t.Errorf("%s %s %.80s: a valid request the document refuses: %v", method, path, body, reqErr)
	}
	if !valid && reqErr == nil {
		t.Errorf("%s %s %.80s: an invalid request the document allows", method, path, body)
	}
	resp, err := http.DefaultClient.Do(newReq()) // validation read the first one's body
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	err = openapi3filter.ValidateResponse(t.Context(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Body:    io.NopCloser(bytes.NewReader(got)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	})
	if err != nil {
		t.Errorf("%s %s %.80s: status %d: the response does not match the document: %v\n%s", method, path, body, resp.StatusCode, err, got)
	}
	c.covered[fmt.Sprintf("%s %s %d", method, route.Path, resp.StatusCode)] = true
	return resp.StatusCode
}

// TestAdminOpenAPIContract sends each admin route valid and invalid
// requests, over dead letters and a rebuild in PostgreSQL, and checks
// every request and response against the document serve serves.
func TestAdminOpenAPIContract(t *testing.T) {
	doc := adminDocument(t)
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	c := &contract{router: router, covered: map[string]bool{}}
	f := newFixture(t, &resetter{})
	projs, err := projection.Parse([]byte(accountsYAML), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rebuild.NewStore(f.pool).Ensure(t.Context(), "ident", projs); err != nil {
		t.Fatal(err)
	}
	open1 := f.insert(t, "accounts", "open", 1)
	open2 := f.insert(t, "accounts", "open", 2)
	f.insert(t, "accounts", "resolved", 3)
	const admin, reader = "admin-token", "reader-token"
	check := func(valid bool, token, method, path, body string, want int) {
		t.Helper()
		if got := c.call(t, f, valid, token, method, path, body); got != want {
			t.Errorf("%s %s %.80s: status %d, want %d", method, path, body, got, want)
		}
	}

	dl := "/admin/v1/dead-letters"
	check(true, admin, "GET", dl, "", 200)
	check(true, admin, "GET", dl+"?projection=accounts&status=open&since=7d&limit=10", "", 200)
	check(true, admin, "GET", dl+"?since=yesterday", "", 400)
	check(true, admin, "GET", dl+"?colour=red", "", 400) // OpenAPI cannot refuse an unknown parameter; the API does
	check(false, admin, "GET", dl+"?limit=0", "", 400)
	check(false, admin, "GET", dl+"?limit=1001", "", 400)
	check(false, "", "GET", dl, "", 401)
	check(true, "forged", "GET", dl, "", 401)
	check(true, reader, "GET", dl, "", 403)
	check(true, admin, "GET", fmt.Sprintf("%s/%d", dl, open1), "", 200)
	check(true, admin, "GET", dl+"/999999", "", 404)
	check(false, admin, "GET", dl+"/abc", "", 400)

	check(true, admin, "POST", dl+"/redrives", fmt.Sprintf(`{"ids":[%d],"dry_run":true}`, open1), 200)
	check(true, admin, "POST", dl+"/redrives", `{"filter":{"projection":"accounts","status":"open"},"limit":1}`, 202)
	check(true, admin, "POST", dl+"/redrives", `{}`, 400)
	check(false, admin, "POST", dl+"/redrives", `{"ids":[1],"colour":"red"}`, 400)
	check(false, admin, "POST", dl+"/redrives", `{"ids":"all"}`, 400)
	check(false, admin, "POST", dl+"/redrives", ``, 400)
	check(true, admin, "POST", dl+"/redrives", `{"ids":[`+strings.Repeat("1,", adminapi.MaxBody/2)+`1]}`, 413)
	check(true, reader, "POST", dl+"/redrives", `{"ids":[1]}`, 403)
	check(true, admin, "POST", dl+"/purges", `{"filter":{"status":"resolved"},"dry_run":true}`, 200)
	check(true, admin, "POST", dl+"/purges", fmt.Sprintf(`{"ids":[%d]}`, open2), 200)
	check(false, admin, "POST", dl+"/purges", `{"filter":{"colour":"red"}}`, 400)
	check(false, "", "POST", dl+"/purges", `{"ids":[1]}`, 401)

	resets := "/admin/v1/offsets/resets"
	check(true, admin, "POST", resets, `{"topic":"accounts.events","to":"earliest","dry_run":true}`, 200)
	check(true, admin, "POST", resets, `{"topic":"accounts.events","partitions":[0],"to_offset":5}`, 200)
	check(true, admin, "POST", resets, `{"topic":"accounts.events","to":"earliest","to_offset":5}`, 400)
	check(false, admin, "POST", resets, `{"topic":"accounts.events","to":"middle"}`, 400)
	check(false, admin, "POST", resets, `{"to":"latest"}`, 400)
	check(true, reader, "POST", resets, `{"topic":"accounts.events","to":"latest"}`, 403)
	// Without the brokers (serve) offset resets are not served.
	unserved := newFixture(t, nil)
	if got := c.call(t, unserved, true, admin, "POST", resets, `{"topic":"accounts.events","to":"latest"}`); got != 501 {
		t.Errorf("an offset reset without the brokers: status %d, want 501", got)
	}

	check(true, admin, "GET", "/admin/v1/operations", "", 200)
	check(true, admin, "POST", "/admin/v1/projections/accounts/rebuilds", `{"retain":"48h"}`, 202)
	check(true, admin, "POST", "/admin/v1/projections/accounts/rebuilds", ``, 409)
	check(false, admin, "POST", "/admin/v1/projections/accounts/rebuilds", `{"actor":"mallory"}`, 400)
	check(true, admin, "POST", "/admin/v1/projections/nope/rebuilds", `{}`, 404)
	check(true, admin, "POST", "/admin/v1/projections/accounts/rollbacks", ``, 409)
	check(true, admin, "POST", "/admin/v1/projections/nope/rollbacks", ``, 404)
	check(false, admin, "POST", "/admin/v1/projections/nope/rollbacks", `{"actor":"mallory"}`, 400)
	check(true, reader, "POST", "/admin/v1/projections/accounts/rollbacks", ``, 403)
	var id string
	if err := f.pool.QueryRow(t.Context(), `SELECT id::text FROM projector_rebuilds LIMIT 1`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	check(true, admin, "GET", "/admin/v1/operations", "", 200)
	check(true, admin, "GET", "/admin/v1/operations/"+id, "", 200)
	check(true, admin, "GET", "/admin/v1/operations/nope", "", 404)
	check(true, admin, "DELETE", "/admin/v1/operations/"+id+"?actor=mallory", "", 400)
	check(true, admin, "DELETE", "/admin/v1/operations/"+id, "", 200)
	check(true, admin, "DELETE", "/admin/v1/operations/"+id, "", 409)
	check(true, admin, "DELETE", "/admin/v1/operations/nope", "", 404)
	check(false, "", "DELETE", "/admin/v1/operations/nope", "", 401)

	// Each route's success, refusals and errors have been met, so that no
	// part of the document goes unchecked but the failures of PostgreSQL
	// (500, 503).
	for _, want := range []string{
		"GET /admin/v1/dead-letters 200", "GET /admin/v1/dead-letters 400", "GET /admin/v1/dead-letters 401", "GET /admin/v1/dead-letters 403",
		"GET /admin/v1/dead-letters/{id} 200", "GET /admin/v1/dead-letters/{id} 400", "GET /admin/v1/dead-letters/{id} 404",
		"POST /admin/v1/dead-letters/redrives 200", "POST /admin/v1/dead-letters/redrives 202", "POST /admin/v1/dead-letters/redrives 400",
		"POST /admin/v1/dead-letters/redrives 403", "POST /admin/v1/dead-letters/redrives 413",
		"POST /admin/v1/dead-letters/purges 200", "POST /admin/v1/dead-letters/purges 400", "POST /admin/v1/dead-letters/purges 401",
		"POST /admin/v1/offsets/resets 200", "POST /admin/v1/offsets/resets 400", "POST /admin/v1/offsets/resets 403", "POST /admin/v1/offsets/resets 501",
		"POST /admin/v1/projections/{name}/rebuilds 202", "POST /admin/v1/projections/{name}/rebuilds 400",
		"POST /admin/v1/projections/{name}/rebuilds 404", "POST /admin/v1/projections/{name}/rebuilds 409",
		"POST /admin/v1/projections/{name}/rollbacks 400", "POST /admin/v1/projections/{name}/rollbacks 403",
		"POST /admin/v1/projections/{name}/rollbacks 404", "POST /admin/v1/projections/{name}/rollbacks 409",
		"GET /admin/v1/operations 200", "GET /admin/v1/operations/{id} 200", "GET /admin/v1/operations/{id} 404",
		"DELETE /admin/v1/operations/{id} 200", "DELETE /admin/v1/operations/{id} 400", "DELETE /admin/v1/operations/{id} 401",
		"DELETE /admin/v1/operations/{id} 404", "DELETE /admin/v1/operations/{id} 409",
	} {
		if !c.covered[want] {
			t.Errorf("never met: %s", want)
		}
	}
}

// TestAdminOpenAPIRoutes fails on an admin route the API serves that the
// document does not describe, and on an admin path of the document the
// API does not serve.
func TestAdminOpenAPIRoutes(t *testing.T) {
	doc := adminDocument(t)
	f := newFixture(t, nil)
	api, err := adminapi.Handler(adminapi.Config{DB: f.pool, Identity: "ident", Authenticator: testTokens})
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, pattern := range api.Routes() {
		method, path, _ := strings.Cut(pattern, " ")
		served[pattern] = true
		item := doc.Paths.Value(path)
		if item == nil || item.GetOperation(method) == nil {
			t.Errorf("route %s is not in the document", pattern)
		}
	}
	if len(served) == 0 {
		t.Fatal("the admin API lists no routes")
	}
	for path, item := range doc.Paths.Map() {
		if !strings.HasPrefix(path, "/admin/") {
			continue
		}
		for method := range item.Operations() {
			if !served[method+" "+path] {
				t.Errorf("the document describes %s %s, which the admin API does not serve", method, path)
			}
		}
	}
}
