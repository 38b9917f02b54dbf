package readapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/auth"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/readapi"
	"github.com/projector-dev/projector/sinks/postgres"
)

const ordersYAML = `projections:
  - name: orders
    topic: orders
    table: orders
    key: id
    mode: snapshot
    filterable: [status, amount]
    tenant: org
    columns:
      id: {type: text, primary_key: true}
      org: {type: text}
      status: {type: text}
      amount: {type: bigint}
`

// tokens is a test authenticator: the bearer token names a principal.
type tokens map[string]auth.Principal

func (t tokens) Authenticate(r *http.Request) (auth.Principal, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return auth.Principal{}, fmt.Errorf("no token: %w", auth.ErrUnauthenticated)
	}
	p, ok := t[strings.TrimPrefix(h, "Bearer ")]
	if !ok {
		return auth.Principal{}, fmt.Errorf("unknown token: %w", auth.ErrUnauthenticated)
	}
	return p, nil
}

var testTokens = tokens{
	"all":    {Subject: "all", Scopes: []string{auth.ScopeReadAll}},
	"acme":   {Subject: "acme-reader", Scopes: []string{auth.ReadScope("orders")}, Tenant: "acme"},
	"globex": {Subject: "globex-reader", Scopes: []string{auth.ReadScope("orders")}, Tenant: "globex"},
	"other":  {Subject: "other", Scopes: []string{auth.ReadScope("payments")}},
}

type bundle struct {
	db  *testenv.DB
	api *readapi.API
	srv *httptest.Server
	reg *prometheus.Registry
}

func setup(t testing.TB, yaml string, cfg readapi.Config) *bundle {
	t.Helper()
	db := testenv.NewDB(t)
	ps, err := projection.Parse([]byte(yaml), ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(t.Context(), db.Pool, ps...); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg.Projections, cfg.DB, cfg.Registerer = ps, db.Pool, reg
	if cfg.Authenticator == nil {
		cfg.Authenticator = testTokens
	}
	api, err := readapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return &bundle{db: db, api: api, srv: srv, reg: reg}
}

func (b *bundle) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := b.db.Pool.Exec(t.Context(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	return m
}

// problemCode checks r is a problem of status and returns its code.
func (r response) problem(t *testing.T, status int, code string) map[string]any {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("content type %q, want application/problem+json", ct)
	}
	m := r.json(t)
	if m["code"] != code || m["status"] != float64(status) || m["type"] == "" || m["title"] == "" {
		t.Errorf("problem %v, want code %s status %d with a type and title", m, code, status)
	}
	return m
}

func (b *bundle) get(t *testing.T, token, path string, header ...string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := b.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, body}
}

func TestGetRow(t *testing.T) {
	b := setup(t, ordersYAML, readapi.Config{})
	b.exec(t, `INSERT INTO orders (id, org, status, amount, version) VALUES ('o1', 'acme', 'open', 12, 3)`)

	r := b.get(t, "all", "/v1/projections/orders/rows/o1")
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if got, want := string(r.body), `{"id":"o1","org":"acme","status":"open","amount":12,"version":3}`+"\n"; got != want {
		t.Errorf("body %s, want %s", got, want)
	}
	if r.header.Get("ETag") != `"3"` || r.header.Get("Projector-Version") != "3" {
		t.Errorf("ETag %q Projector-Version %q, want \"3\" and 3", r.header.Get("ETag"), r.header.Get("Projector-Version"))
	}
	if r.header.Get("Projector-Staleness-Seconds") != "" {
		t.Error("a staleness header without a staleness source")
	}

	r = b.get(t, "all", "/v1/projections/orders/rows/o1", "If-None-Match", `"3"`)
	if r.status != http.StatusNotModified || len(r.body) != 0 || r.header.Get("ETag") != `"3"` {
		t.Errorf("If-None-Match the current version: status %d body %q ETag %q, want 304, none, \"3\"", r.status, r.body, r.header.Get("ETag"))
	}
	b.exec(t, `UPDATE orders SET status = 'paid', version = 4 WHERE id = 'o1'`)
	r = b.get(t, "all", "/v1/projections/orders/rows/o1", "If-None-Match", `"3"`)
	if r.status != http.StatusOK || r.json(t)["status"] != "paid" || r.header.Get("ETag") != `"4"` {
		t.Errorf("If-None-Match an older version: status %d body %s, want 200 with version 4", r.status, r.body)
	}

	b.get(t, "all", "/v1/projections/orders/rows/nope").problem(t, http.StatusNotFound, readapi.CodeNotFound)
	b.exec(t, `DELETE FROM orders WHERE id = 'o1'`) // the engine's delete
	b.get(t, "all", "/v1/projections/orders/rows/o1").problem(t, http.StatusNotFound, readapi.CodeNotFound)
	b.get(t, "all", "/v1/projections/nope/rows/o1").problem(t, http.StatusNotFound, readapi.CodeNotFound)
	b.get(t, "all", "/v1/projections/orders/rows/o1?colour=red").problem(t, http.StatusBadRequest, readapi.CodeBadParameter)
	b.get(t, "all", "/v1/projections/orders/rows/o1?min_version=4").problem(t, http.StatusBadRequest, readapi.CodeMinVersionNotHere)
	b.get(t, "all", "/nowhere").problem(t, http.StatusNotFound, readapi.CodeNotFound)
}

func TestScopes(t *testing.T) {
	b := setup(t, ordersYAML, readapi.Config{})
	b.exec(t, `INSERT INTO orders (id, org, status, amount, version) VALUES ('o1', 'acme', 'open', 12, 1)`)
	for _, path := range []string{"/v1/projections/orders/rows/o1", "/v1/projections/orders/rows"} {
		r := b.get(t, "", path)
		r.problem(t, http.StatusUnauthorized, readapi.CodeUnauthenticated)
		if r.header.Get("WWW-Authenticate") == "" {
			t.Error("a 401 without WWW-Authenticate")
		}
		b.get(t, "forged", path).problem(t, http.StatusUnauthorized, readapi.CodeUnauthenticated)
		b.get(t, "other", path).problem(t, http.StatusForbidden, readapi.CodeForbidden)
	}
	// Without a token, whether a projection exists is not told.
	b.get(t, "", "/v1/projections/nope/rows/o1").problem(t, http.StatusUnauthorized, readapi.CodeUnauthenticated)
	b.get(t, "other", "/v1/projections/nope/rows/o1").problem(t, http.StatusNotFound, readapi.CodeNotFound)

	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, b.srv.URL+"/v1/projections/orders/rows/o1", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer all")
	resp, err := b.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: status %d Allow %q, want 405 and GET, HEAD", resp.StatusCode, resp.Header.Get("Allow"))
	}
	req, _ = http.NewRequestWithContext(t.Context(), http.MethodGet, b.srv.URL+"/v1/projections/orders/rows/o1", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer all")
	resp, err = b.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("GET with a body: status %d, want 400", resp.StatusCode)
	}
}

func TestTenantIsolation(t *testing.T) {
	b := setup(t, ordersYAML, readapi.Config{})
	b.exec(t, `INSERT INTO orders (id, org, status, amount, version) VALUES
		('a1', 'acme', 'open', 1, 1), ('a2', 'acme', 'paid', 2, 1), ('g1', 'globex', 'open', 3, 1)`)

	if r := b.get(t, "acme", "/v1/projections/orders/rows/a1"); r.status != http.StatusOK {
		t.Errorf("own tenant's row: status %d", r.status)
	}
	other := b.get(t, "acme", "/v1/projections/orders/rows/g1")
	missing := b.get(t, "acme", "/v1/projections/orders/rows/zz")
	other.problem(t, http.StatusNotFound, readapi.CodeNotFound)
	missing.problem(t, http.StatusNotFound, readapi.CodeNotFound)
	// Another tenant's row answers as a missing one does, but for the key.
	if strings.ReplaceAll(string(other.body), "g1", "zz") != string(missing.body) {
		t.Errorf("another tenant's row answers %s, a missing one %s", other.body, missing.body)
	}
	keys := func(token, query string) []string {
		r := b.get(t, token, "/v1/projections/orders/rows"+query)
		if r.status != http.StatusOK {
			t.Fatalf("list: status %d %s", r.status, r.body)
		}
		var out []string
		for _, row := range r.json(t)["rows"].([]any) {
			out = append(out, row.(map[string]any)["id"].(string))
		}
		return out
	}
	if got := keys("acme", ""); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Errorf("acme lists %q, want a1 a2", got)
	}
	if got := keys("globex", ""); !slices.Equal(got, []string{"g1"}) {
		t.Errorf("globex lists %q, want g1", got)
	}
	if got := keys("acme", "?status=open"); !slices.Equal(got, []string{"a1"}) {
		t.Errorf("acme lists open %q, want a1", got)
	}
	// A principal without a tenant reads every tenant's rows.
	if got := keys("all", ""); !slices.Equal(got, []string{"a1", "a2", "g1"}) {
		t.Errorf("a principal without a tenant lists %q, want every row", got)
	}
}

func TestListPagesAndFilters(t *testing.T) {
	b := setup(t, ordersYAML, readapi.Config{})
	for i := range 25 {
		status := "open"
		if i%2 == 1 {
			status = "paid"
		}
		b.exec(t, `INSERT INTO orders (id, org, status, amount, version) VALUES ($1, 'acme', $2, $3, 1)`, fmt.Sprintf("k%02d", i*2), status, i)
	}
	// Pages of 10 in key order; rows inserted before and after the
	// cursor between pages: those after it are met, none twice.
	var seen []string
	path := "/v1/projections/orders/rows?limit=10"
	for page := 0; path != ""; page++ {
		if page > 10 {
			t.Fatal("pages never end")
		}
		r := b.get(t, "all", path)
		if r.status != http.StatusOK {
			t.Fatalf("page %d: status %d %s", page, r.status, r.body)
		}
		m := r.json(t)
		rows := m["rows"].([]any)
		if len(rows) > 10 {
			t.Fatalf("page of %d rows, limit 10", len(rows))
		}
		for _, row := range rows {
			seen = append(seen, row.(map[string]any)["id"].(string))
		}
		if page == 0 {
			b.exec(t, `INSERT INTO orders (id, org, status, amount, version) VALUES ('k03', 'acme', 'open', 0, 1), ('k41', 'acme', 'open', 0, 1)`)
		}
		path = ""
		if next, ok := m["next"].(string); ok {
			path = next
			if link := r.header.Get("Link"); link != "<"+next+`>; rel="next"` {
				t.Errorf("Link %q, want the next link", link)
			}
		}
	}
	var want []string
	for i := range 25 {
		want = append(want, fmt.Sprintf("k%02d", i*2))
	}
	want = append(want, "k41")
	slices.Sort(want)
	if !slices.Equal(seen, want) {
		t.Errorf("pages gave %q, want %q (k03 was inserted behind the cursor)", seen, want)
	}

	r := b.get(t, "all", "/v1/projections/orders/rows?status=paid&amount=3")
	if rows := r.json(t)["rows"].([]any); len(rows) != 1 || rows[0].(map[string]any)["id"] != "k06" {
		t.Errorf("status=paid&amount=3: %s, want k06 alone", r.body)
	}
	if r.json(t)["next"] != nil {
		t.Errorf("a last page's next is %v, want null", r.json(t)["next"])
	}
	r = b.get(t, "all", "/v1/projections/orders/rows")
	if n := len(r.json(t)["rows"].([]any)); n != 27 {
		t.Errorf("default limit: %d rows, want all 27", n)
	}

	p := b.get(t, "all", "/v1/projections/orders/rows?org=acme").problem(t, http.StatusBadRequest, readapi.CodeBadFilter)
	if fs, _ := p["filterable"].([]any); len(fs) != 2 || fs[0] != "amount" || fs[1] != "status" || !strings.Contains(p["detail"].(string), "amount, status") {
		t.Errorf("bad filter problem %v, want the filterable columns named", p)
	}
	b.get(t, "all", "/v1/projections/orders/rows?amount=lots").problem(t, http.StatusBadRequest, readapi.CodeBadFilter)
	b.get(t, "all", "/v1/projections/orders/rows?limit=0").problem(t, http.StatusBadRequest, readapi.CodeBadParameter)
	b.get(t, "all", "/v1/projections/orders/rows?limit=1001").problem(t, http.StatusBadRequest, readapi.CodeBadParameter)
	b.get(t, "all", "/v1/projections/orders/rows?after=garbage").problem(t, http.StatusBadRequest, readapi.CodeBadCursor)
	b.get(t, "all", "/v1/projections/orders/rows?min_version=3").problem(t, http.StatusBadRequest, readapi.CodeBadParameter)
	b.get(t, "all", "/v1/projections/orders/rows?status=a&status=b").problem(t, http.StatusBadRequest, readapi.CodeBadParameter)
	if r := b.get(t, "all", "/v1/projections/orders/rows?limit=1000"); r.status != http.StatusOK {
		t.Errorf("limit=1000: status %d", r.status)
	}
	// Filter values reach SQL as parameters only.
	r = b.get(t, "all", "/v1/projections/orders/rows?status="+url.QueryEscape("open' OR 'x'='x"))
	if rows := r.json(t)["rows"].([]any); len(rows) != 0 {
		t.Errorf("a quoted filter value matched %d rows", len(rows))
	}
}

// TestTypes: every column type the projection docs allow, as docs/api.md
// maps it to JSON.
func TestTypes(t *testing.T) {
	const yaml = `projections:
  - name: typed
    topic: typed
    table: typed
    key: id
    mode: snapshot
    columns:
      id: {type: bigint, primary_key: true}
      i2: {type: smallint}
      i4: {type: integer}
      i8: {type: bigint}
      f4: {type: real}
      f8: {type: double precision}
      nan: {type: double precision}
      n: {type: numeric}
      n2: {type: "numeric(10,2)"}
      b: {type: boolean}
      t: {type: text}
      vc: {type: "varchar(10)"}
      ch: {type: "char(3)"}
      u: {type: uuid}
      ip: {type: inet}
      ts: {type: timestamptz}
      ts3: {type: "timestamptz(3)"}
      tsl: {type: timestamp}
      d: {type: date}
      tm: {type: time}
      by: {type: bytea}
      jb: {type: jsonb}
      js: {type: json}
      e: {type: mood}
      ta: {type: "text[]"}
      ia: {type: "bigint[]"}
      na: {type: "numeric[]"}
      fa: {type: "double precision[]"}
      ba: {type: "boolean[]"}
      tsa: {type: "timestamptz[]"}
      ja: {type: "jsonb[]"}
      bya: {type: "bytea[]"}
      i2d: {type: "integer[][]"}
      empty: {type: "text[]"}
      nul: {type: text}
`
	db := testenv.NewDB(t)
	if _, err := db.Pool.Exec(t.Context(), `CREATE TYPE mood AS ENUM ('sad', 'happy')`); err != nil {
		t.Fatal(err)
	}
	ps, err := projection.Parse([]byte(yaml), ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(t.Context(), db.Pool, ps...); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(t.Context(), `INSERT INTO typed VALUES (
		9007199254740993, -32768, 2147483647, 9223372036854775807, 1.5, 0.1, 'NaN',
		123456789012345678901234567890.123456789, 12.50, true, 'ünïcode "q"', 'abc', 'ab', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
		'10.0.0.1', '2024-05-17 09:30:15.123456+02', '2024-05-17 09:30:15.1+00', '2024-05-17 09:30:15.5', '2024-05-17', '13:14:15.678',
		'\x00ff10', '{"b": 1, "a": [1.10, 12345678901234567890]}', '{"z": 1,  "a": 2}', 'happy',
		'{a,"b c",NULL}', '{1,-2}', '{1.50,NaN}', '{0.5,Infinity}', '{t,f}', '{"2024-05-17 09:30:15.25+00"}',
		ARRAY['{"x": 1}'::jsonb], ARRAY['\x01'::bytea], '{{1,2},{3,4}}', '{}', NULL, 7)`); err != nil {
		t.Fatal(err)
	}
	api, err := readapi.New(readapi.Config{Projections: ps, DB: db.Pool, Authenticator: auth.None{}})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/v1/projections/typed/rows/9007199254740993", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	want := `{"id":9007199254740993,"i2":-32768,"i4":2147483647,"i8":9223372036854775807,"f4":1.5,"f8":0.1,"nan":"NaN",` +
		`"n":"123456789012345678901234567890.123456789","n2":"12.50","b":true,"t":"ünïcode \"q\"","vc":"abc","ch":"ab ",` +
		`"u":"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11","ip":"10.0.0.1","ts":"2024-05-17T07:30:15.123456Z","ts3":"2024-05-17T09:30:15.100Z",` +
		`"tsl":"2024-05-17T09:30:15.5","d":"2024-05-17","tm":"13:14:15.678","by":"AP8Q",` +
		`"jb":{"a": [1.10, 12345678901234567890], "b": 1},"js":{"z": 1,  "a": 2},"e":"happy",` +
		`"ta":["a","b c",null],"ia":[1,-2],"na":["1.50","NaN"],"fa":[0.5,"Infinity"],"ba":[true,false],` +
		`"tsa":["2024-05-17T09:30:15.25Z"],"ja":[{"x": 1}],"bya":["AQ=="],"i2d":[[1,2],[3,4]],"empty":[],"nul":null,"version":7}` + "\n"
	if got := rec.Body.String(); got != want {
		t.Errorf("row:\n got %s\nwant %s", got, want)
	}
	if !json.Valid(rec.Body.Bytes()) {
		t.Error("the row is not JSON")
	}
	// A key its column's type cannot hold is a missing row.
	rec = httptest.NewRecorder()
	api.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/v1/projections/typed/rows/abc", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("a key that is not a bigint: status %d, want 404: %s", rec.Code, rec.Body)
	}
}

// fakeFreshness stands in for the version watcher and staleness source.
type fakeFreshness struct {
	mu       sync.Mutex
	staleFor time.Duration
	reach    func(key string, min int64) error
	asked    []string
}

func (f *fakeFreshness) Staleness(_ context.Context, projection, key string) (time.Duration, error) {
	return f.staleFor, nil
}

func (f *fakeFreshness) WaitVersion(_ context.Context, projection, key, tenant string, min int64, wait time.Duration) error {
	f.mu.Lock()
	f.asked = append(f.asked, fmt.Sprintf("%s/%s tenant=%s min=%d wait=%s", projection, key, tenant, min, wait))
	f.mu.Unlock()
	return f.reach(key, min)
}

func TestMinVersionAndStaleness(t *testing.T) {
	f := &fakeFreshness{staleFor: 1500 * time.Millisecond}
	b := setup(t, ordersYAML, readapi.Config{Staleness: f, Waiter: f})
	b.exec(t, `INSERT INTO orders (id, org, status, amount, version) VALUES ('o1', 'acme', 'open', 12, 3)`)
	f.reach = func(string, int64) error { return nil }
	r := b.get(t, "acme", "/v1/projections/orders/rows/o1?min_version=3&wait=2s")
	if r.status != http.StatusOK || r.header.Get("Projector-Staleness-Seconds") != "1.500" {
		t.Errorf("reached: status %d staleness %q, want 200 and 1.500", r.status, r.header.Get("Projector-Staleness-Seconds"))
	}
	b.get(t, "acme", "/v1/projections/orders/rows/o1", "Projector-Min-Version", "2")
	if want := []string{"orders/o1 tenant=acme min=3 wait=2s", "orders/o1 tenant=acme min=2 wait=5s"}; !slices.Equal(f.asked, want) {
		t.Errorf("waits asked %q, want %q", f.asked, want)
	}

	f.reach = func(string, int64) error { return fmt.Errorf("after 5s: %w", readapi.ErrVersionNotReached) }
	p := b.get(t, "acme", "/v1/projections/orders/rows/o1?min_version=9").problem(t, http.StatusPreconditionFailed, readapi.CodeVersionNotReached)
	if p["current_version"] != float64(3) {
		t.Errorf("version_not_reached current_version %v, want 3", p["current_version"])
	}
	r = b.get(t, "acme", "/v1/projections/orders/rows/o1?min_version=9&stale=ok")
	if r.status != http.StatusOK || r.header.Get("Projector-Stale") != "true" || r.header.Get("Projector-Version") != "3" {
		t.Errorf("stale=ok: status %d Projector-Stale %q version %q, want 200, true, 3", r.status, r.header.Get("Projector-Stale"), r.header.Get("Projector-Version"))
	}
	// Reached between the wait's end and the read: the row.
	if r := b.get(t, "acme", "/v1/projections/orders/rows/o1?min_version=3"); r.status != http.StatusOK || r.header.Get("Projector-Stale") != "" {
		t.Errorf("a version reached after the wait: status %d Projector-Stale %q, want 200 and none", r.status, r.header.Get("Projector-Stale"))
	}
	// Another tenant's row: its version is never told.
	p = b.get(t, "globex", "/v1/projections/orders/rows/o1?min_version=9").problem(t, http.StatusPreconditionFailed, readapi.CodeVersionNotReached)
	if _, ok := p["current_version"]; ok {
		t.Errorf("another tenant's version told: %v", p)
	}

	f.reach = func(string, int64) error { return readapi.ErrTooManyWaiters }
	b.get(t, "acme", "/v1/projections/orders/rows/o1?min_version=9").problem(t, http.StatusTooManyRequests, readapi.CodeTooManyWaiters)
	f.reach = func(string, int64) error { return errors.New("broken") }
	b.get(t, "acme", "/v1/projections/orders/rows/o1?min_version=9").problem(t, http.StatusServiceUnavailable, readapi.CodeUnavailable)
	b.get(t, "acme", "/v1/projections/orders/rows/o1?min_version=9&wait=31s").problem(t, http.StatusBadRequest, readapi.CodeBadParameter)
	b.get(t, "acme", "/v1/projections/orders/rows/o1?min_version=x").problem(t, http.StatusBadRequest, readapi.CodeBadParameter)
	// stale and wait without a min_version change nothing, but each is
	// checked wherever it is given, as is the header.
	if r := b.get(t, "acme", "/v1/projections/orders/rows/o1?stale=ok&wait=1s"); r.status != http.StatusOK || r.header.Get("Projector-Stale") != "" {
		t.Errorf("stale=ok without min_version: status %d stale %q, want 200 and no Projector-Stale", r.status, r.header.Get("Projector-Stale"))
	}
	b.get(t, "acme", "/v1/projections/orders/rows/o1?stale=yes").problem(t, http.StatusBadRequest, readapi.CodeBadParameter)
	b.get(t, "acme", "/v1/projections/orders/rows/o1?wait=1h").problem(t, http.StatusBadRequest, readapi.CodeBadParameter)
	b.get(t, "acme", "/v1/projections/orders/rows/o1?min_version=1", "Projector-Min-Version", "{}").problem(t, http.StatusBadRequest, readapi.CodeBadParameter)
	f.reach = func(_ string, min int64) error {
		if min > 3 {
			return readapi.ErrVersionNotReached
		}
		return nil
	}
	if r := b.get(t, "acme", "/v1/projections/orders/rows/o1?min_version=1", "Projector-Min-Version", "9"); r.status != http.StatusOK {
		t.Errorf("min_version 1 and the header 9: status %d, want 200: the query's is taken", r.status)
	}
	b.get(t, "acme", "/v1/projections/orders/rows/o1?min_version=", "Projector-Min-Version", "2").problem(t, http.StatusBadRequest, readapi.CodeBadParameter)
}

func TestMetrics(t *testing.T) {
	b := setup(t, ordersYAML, readapi.Config{})
	b.exec(t, `INSERT INTO orders (id, org, status, amount, version) VALUES ('o1', 'acme', 'open', 12, 3)`)
	b.get(t, "all", "/v1/projections/orders/rows/o1")
	b.get(t, "all", "/v1/projections/orders/rows/o2")
	b.get(t, "all", "/v1/projections/orders/rows/o3")
	b.get(t, "", "/v1/projections/orders/rows")
	for _, c := range []struct {
		route, code string
		want        float64
	}{
		{"/v1/projections/{name}/rows/{key}", "200", 1},
		{"/v1/projections/{name}/rows/{key}", "404", 2},
		{"/v1/projections/{name}/rows", "401", 1},
	} {
		got := counter(t, b.reg, c.route, c.code)
		if got != c.want {
			t.Errorf("projector_http_requests_total{route=%q,code=%q} = %v, want %v", c.route, c.code, got, c.want)
		}
	}
	mfs, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "projector_http_request_duration_seconds" {
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == "/v1/projections/{name}/rows/{key}" && m.GetHistogram().GetSampleCount() != 3 {
					t.Errorf("duration of rows/{key}: %d observations, want 3", m.GetHistogram().GetSampleCount())
				}
			}
			if n := len(mf.GetMetric()); n != 2 {
				t.Errorf("duration series: %d, want one per route", n)
			}
		}
	}
}

// counter is the requests counter of route and code, as gathered.
func counter(t *testing.T, reg *prometheus.Registry, route, code string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "projector_http_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["route"] == route && labels["code"] == code {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestFailureHeardOnce: a table that cannot be read fails every
// request with a 503, logged once when it begins and once when it ends;
// the table back, the columns are read again.
func TestFailureHeardOnce(t *testing.T) {
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	b := setup(t, ordersYAML, readapi.Config{Logger: log})
	b.exec(t, `INSERT INTO orders (id, org, status, amount, version) VALUES ('o1', 'acme', 'open', 12, 3)`)
	if r := b.get(t, "all", "/v1/projections/orders/rows/o1"); r.status != http.StatusOK {
		t.Fatalf("status %d", r.status)
	}
	b.exec(t, `ALTER TABLE orders RENAME TO orders_away`)
	for range 5 {
		b.get(t, "all", "/v1/projections/orders/rows/o1").problem(t, http.StatusServiceUnavailable, readapi.CodeUnavailable)
	}
	b.exec(t, `ALTER TABLE orders_away RENAME TO orders`)
	if r := b.get(t, "all", "/v1/projections/orders/rows/o1"); r.status != http.StatusOK {
		t.Fatalf("the table back: status %d %s", r.status, r.body)
	}
	out := logs.String()
	if n := strings.Count(out, "reading PostgreSQL failed"); n != 1 {
		t.Errorf("the failure logged %d times, want once:\n%s", n, out)
	}
	if n := strings.Count(out, "reading PostgreSQL succeeds again"); n != 1 {
		t.Errorf("the recovery logged %d times, want once:\n%s", n, out)
	}
	if strings.Contains(out, "Bearer") {
		t.Errorf("a token reached the log:\n%s", out)
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestReadsThroughAView: a rebuilt projection's table name is a view of
// its live generation's table; reading by the name follows a cutover to
// another generation without a restart.
func TestReadsThroughAView(t *testing.T) {
	db := testenv.NewDB(t)
	ctx := t.Context()
	for _, gen := range []string{"orders_g2", "orders_g3"} {
		ps, err := projection.Parse([]byte(strings.Replace(ordersYAML, "table: orders", "table: "+gen, 1)), ".")
		if err != nil {
			t.Fatal(err)
		}
		if err := postgres.Migrate(ctx, db.Pool, ps...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO orders_g2 VALUES ('o1', 'acme', 'open', 1, 1);
		INSERT INTO orders_g3 VALUES ('o1', 'acme', 'rebuilt', 1, 5);
		CREATE VIEW orders AS SELECT * FROM orders_g2`); err != nil {
		t.Fatal(err)
	}
	ps, err := projection.Parse([]byte(ordersYAML), ".")
	if err != nil {
		t.Fatal(err)
	}
	api, err := readapi.New(readapi.Config{Projections: ps, DB: db.Pool, Authenticator: auth.None{}})
	if err != nil {
		t.Fatal(err)
	}
	get := func() string {
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/projections/orders/rows/o1", nil))
		return rec.Body.String()
	}
	if got := get(); !strings.Contains(got, `"status":"open"`) {
		t.Fatalf("through the view of generation 2: %s", got)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE OR REPLACE VIEW orders AS SELECT * FROM orders_g3`); err != nil {
		t.Fatal(err)
	}
	if got := get(); !strings.Contains(got, `"status":"rebuilt"`) || !strings.Contains(got, `"version":5`) {
		t.Errorf("after the cutover to generation 3: %s", got)
	}

	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodHead, "/v1/projections/orders/rows/o1", nil))
	if rec.Code != http.StatusOK || rec.Body.Len() != 0 || rec.Header().Get("ETag") != `"5"` {
		t.Errorf("HEAD: status %d body %q ETag %q, want 200, no body, \"5\"", rec.Code, rec.Body, rec.Header().Get("ETag"))
	}
}

// TestListNonTextKey pages through a projection whose key is a bigint: its
// text form, for the cursor, must not make the key's ORDER BY ambiguous.
func TestListNonTextKey(t *testing.T) {
	b := setup(t, `projections:
  - name: counters
    topic: counters
    table: counters
    key: id
    mode: snapshot
    columns:
      id: {type: bigint, primary_key: true}
      n: {type: integer}
`, readapi.Config{})
	b.exec(t, `INSERT INTO counters VALUES (10, 1, 1), (9, 2, 1), (100, 3, 1)`)
	var ids []float64
	path := "/v1/projections/counters/rows?limit=2"
	for path != "" {
		r := b.get(t, "all", path)
		if r.status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", path, r.status, r.body)
		}
		m := r.json(t)
		for _, row := range m["rows"].([]any) {
			ids = append(ids, row.(map[string]any)["id"].(float64))
		}
		path, _ = m["next"].(string)
	}
	if !slices.Equal(ids, []float64{9, 10, 100}) {
		t.Errorf("pages hold %v, want 9 10 100 in numeric order", ids)
	}
}

// TestWaitAndFilterSpellings: wait takes seconds, or s or ms, up to 30 s,
// and integer and boolean filters take the spellings the API writes,
// each the grammar the OpenAPI document gives.
func TestWaitAndFilterSpellings(t *testing.T) {
	f := &fakeFreshness{reach: func(string, int64) error { return nil }}
	b := setup(t, `projections:
  - name: flags
    topic: flags
    table: flags
    key: id
    mode: snapshot
    filterable: [on, n]
    columns:
      id: {type: text, primary_key: true}
      on: {type: boolean}
      n: {type: smallint}
`, readapi.Config{Waiter: f})
	b.exec(t, `INSERT INTO flags VALUES ('a', true, 1, 1)`)
	for _, wait := range []string{"0", "2.5", "30", "030.0", "2s", "30s", ".5s", "500ms", "30000ms"} {
		if r := b.get(t, "all", "/v1/projections/flags/rows/a?min_version=1&wait="+wait); r.status != http.StatusOK {
			t.Errorf("wait=%s: status %d %s", wait, r.status, r.body)
		}
	}
	for _, wait := range []string{"30.5", "31s", "30001ms", "1m", "0ns", "-1", "1e1", "", "inf"} {
		b.get(t, "all", "/v1/projections/flags/rows/a?min_version=1&wait="+wait).problem(t, http.StatusBadRequest, readapi.CodeBadParameter)
	}
	for _, q := range []string{"on=true", "on=false", "n=1", "n=-32768", "n=32767"} {
		if r := b.get(t, "all", "/v1/projections/flags/rows?"+q); r.status != http.StatusOK {
			t.Errorf("%s: status %d %s", q, r.status, r.body)
		}
	}
	for _, q := range []string{"on=yes", "on=t", "on=1", "n=32768", "n=+1", "n=0x1", "n="} {
		if r := b.get(t, "all", "/v1/projections/flags/rows?"+q); r.status != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", q, r.status)
		} else {
			r.problem(t, http.StatusBadRequest, readapi.CodeBadFilter)
		}
	}
}

// Reads by key that arrive together are read together: each still gets
// its own row, its tenant's only, a 404 for a key no row has or its
// column's type cannot hold, or a longer one than a varchar(3) key's,
// and a key written otherwise than the stored one (007 for 7) finds its
// row.
func TestGetRowConcurrently(t *testing.T) {
	const countsYAML = `projections:
  - name: counts
    topic: counts
    table: counts
    key: id
    mode: snapshot
    columns:
      id: {type: bigint, primary_key: true}
      n: {type: bigint}
  - name: codes
    topic: codes
    table: codes
    key: id
    mode: snapshot
    columns:
      id: {type: "varchar(3)", primary_key: true}
      n: {type: bigint}
`
	b := setup(t, ordersYAML+strings.TrimPrefix(countsYAML, "projections:\n"), readapi.Config{})
	b.exec(t, `INSERT INTO codes (id, n, version) SELECT lpad(i::text, 3, '0'), i, 1 FROM generate_series(1, 100) i`)
	b.exec(t, `INSERT INTO orders (id, org, status, amount, version)
		SELECT 'o' || i, CASE WHEN i % 2 = 0 THEN 'acme' ELSE 'globex' END, 'open', i, i FROM generate_series(1, 100) i`)
	b.exec(t, `INSERT INTO counts (id, n, version) SELECT i, i * 10, 1 FROM generate_series(1, 100) i`)
	type want struct {
		token, path string
		status      int
		field       string
		value       float64
	}
	var cases []want
	for i := 1; i <= 100; i++ {
		own, other := "acme", "globex"
		if i%2 == 1 {
			own, other = other, own
		}
		path := fmt.Sprintf("/v1/projections/orders/rows/o%d", i)
		cases = append(cases,
			want{own, path, http.StatusOK, "amount", float64(i)},
			want{other, path, http.StatusNotFound, "", 0},
			want{"all", path, http.StatusOK, "amount", float64(i)},
			want{"all", fmt.Sprintf("/v1/projections/counts/rows/%03d", i), http.StatusOK, "n", float64(i * 10)},
			want{"all", fmt.Sprintf("/v1/projections/counts/rows/x%d", i), http.StatusNotFound, "", 0},
			want{"all", fmt.Sprintf("/v1/projections/counts/rows/%d", i+1000), http.StatusNotFound, "", 0},
			want{"all", fmt.Sprintf("/v1/projections/codes/rows/%03d", i), http.StatusOK, "n", float64(i)},
			// Not the row of its first three characters.
			want{"all", fmt.Sprintf("/v1/projections/codes/rows/%03dx", i), http.StatusNotFound, "", 0})
	}
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for round := range 3 {
				for i := g; i < len(cases); i += 32 {
					c := cases[(i+round*7)%len(cases)]
					r := b.get(t, c.token, c.path)
					if r.status != c.status {
						t.Errorf("%s as %s: status %d, want %d: %s", c.path, c.token, r.status, c.status, r.body)
						continue
					}
					if c.field == "" {
						continue
					}
					var m map[string]any
					if err := json.Unmarshal(r.body, &m); err != nil || m[c.field] != c.value {
						t.Errorf("%s as %s: %s, want %s %v", c.path, c.token, r.body, c.field, c.value)
					}
				}
			}
		})
	}
	wg.Wait()
}
