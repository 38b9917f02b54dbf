package rebuild_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/rebuild"
)

const accountsFile = `projections:
  - name: accounts
    topic: accounts.events
    table: accounts
    key: account_id
    mode: snapshot
    columns:
      account_id: {type: text, primary_key: true}
      owner: {type: text}
`

// adminServer serves the admin API of a fresh identity whose projection
// accounts is at generation 1.
func adminServer(t *testing.T) (*httptest.Server, *rebuild.Store, string) {
	t.Helper()
	ctx := t.Context()
	db := testenv.NewDB(t)
	if err := rebuild.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	projs, err := projection.Parse([]byte(accountsFile), "")
	if err != nil {
		t.Fatal(err)
	}
	identity := fmt.Sprintf("admin-%x", rand.Uint64())
	store := rebuild.NewStore(db.Pool)
	if _, err := store.Ensure(ctx, identity, projs); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rebuild.Handler(store, identity, nil))
	t.Cleanup(srv.Close)
	return srv, store, identity
}

// call sends a request and returns the status, the Location header and
// the body decoded into a map.
func call(t *testing.T, srv *httptest.Server, method, path, body string) (int, string, map[string]any) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, r)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s %s: %d, body not a JSON object: %v\n%s", method, path, resp.StatusCode, err, b)
	}
	return resp.StatusCode, resp.Header.Get("Location"), out
}

func errorOf(t *testing.T, body map[string]any) (code, message string) {
	t.Helper()
	e, ok := body["error"].(map[string]any)
	if !ok {
		t.Fatalf("no error object in %v", body)
	}
	code, _ = e["code"].(string)
	message, _ = e["message"].(string)
	return code, message
}

// TestAdminAPIOperations: a start is accepted with where to follow it; a
// second start conflicts naming the first; the operation is listed and
// read; a cancel ends it, and a second cancel conflicts.
func TestAdminAPIOperations(t *testing.T) {
	srv, _, identity := adminServer(t)

	status, loc, op := call(t, srv, "POST", "/admin/v1/projections/accounts/rebuilds", "")
	if status != http.StatusAccepted {
		t.Fatalf("start: %d %v", status, op)
	}
	id, _ := op["operation_id"].(string)
	if id == "" || op["state"] != rebuild.StateAccepted || op["identity"] != identity || op["generation"] != 2.0 {
		t.Fatalf("start answered %v", op)
	}
	if loc != "/admin/v1/operations/"+id {
		t.Errorf("Location %q, want /admin/v1/operations/%s", loc, id)
	}

	status, _, body := call(t, srv, "POST", "/admin/v1/projections/accounts/rebuilds", `{"allow_partial_history": true}`)
	if code, msg := errorOf(t, body); status != http.StatusConflict || code != rebuild.CodeInFlight || !strings.Contains(msg, id) {
		t.Errorf("second start: %d %s %q, want 409 %s naming %s", status, code, msg, rebuild.CodeInFlight, id)
	}
	status, _, body = call(t, srv, "POST", "/admin/v1/projections/accounts/rollbacks", "")
	if code, _ := errorOf(t, body); status != http.StatusConflict || code != rebuild.CodeInFlight {
		t.Errorf("rollback while a rebuild is in flight: %d %s, want 409 %s", status, code, rebuild.CodeInFlight)
	}

	status, _, got := call(t, srv, "GET", "/admin/v1/operations/"+id, "")
	if status != http.StatusOK || got["operation_id"] != id || got["state"] != rebuild.StateAccepted {
		t.Errorf("get: %d %v", status, got)
	}
	status, _, list := call(t, srv, "GET", "/admin/v1/operations", "")
	ops, _ := list["operations"].([]any)
	if status != http.StatusOK || len(ops) != 1 || ops[0].(map[string]any)["operation_id"] != id {
		t.Errorf("list: %d %v", status, list)
	}

	status, _, cancelled := call(t, srv, "DELETE", "/admin/v1/operations/"+id, "")
	if status != http.StatusOK || cancelled["state"] != rebuild.StateCancelled {
		t.Fatalf("cancel: %d %v", status, cancelled)
	}
	if code, _ := errorOf(t, cancelled); code != "cancelled" {
		t.Errorf("cancelled operation's error code %q, want cancelled", code)
	}
	status, _, body = call(t, srv, "DELETE", "/admin/v1/operations/"+id, "")
	if code, msg := errorOf(t, body); status != http.StatusConflict || !strings.Contains(msg, rebuild.StateCancelled) {
		t.Errorf("second cancel: %d %s %q, want 409 saying it is cancelled", status, code, msg)
	}

	// With the first ended, a start with a definition is accepted.
	def := `{"definition": {"name": "accounts", "topic": "accounts.events", "table": "accounts", "key": "account_id", "mode": "snapshot",
		"columns": {"account_id": {"type": "text", "primary_key": true}, "owner": {"type": "text"}, "email": {"type": "text"}}},
		"retain": "1h", "actor": "ann"}`
	status, _, op = call(t, srv, "POST", "/admin/v1/projections/accounts/rebuilds", def)
	if status != http.StatusAccepted || op["actor"] != "ann" || op["retain_seconds"] != 3600.0 || op["generation"] != 3.0 {
		t.Errorf("start with a definition: %d %v", status, op)
	}
}

// TestAdminAPIRefusals: unknown operations and projections are 404, a
// body with an unknown field or a bad definition is 400 naming what is
// wrong, and a rollback with nothing retired conflicts.
func TestAdminAPIRefusals(t *testing.T) {
	srv, _, _ := adminServer(t)
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code, says               string
	}{
		{"unknown operation", "GET", "/admin/v1/operations/7b0e9f5c-0000-4000-8000-000000000000", "", 404, "not_found", "7b0e9f5c"},
		{"not an operation id", "GET", "/admin/v1/operations/nope", "", 404, "not_found", "nope"},
		{"cancel of an unknown operation", "DELETE", "/admin/v1/operations/7b0e9f5c-0000-4000-8000-000000000000", "", 404, "not_found", "7b0e9f5c"},
		{"unknown projection", "POST", "/admin/v1/projections/orders/rebuilds", "", 404, rebuild.CodeUnknown, "orders"},
		{"unknown field", "POST", "/admin/v1/projections/accounts/rebuilds", `{"allow_partial": true}`, 400, "bad_request", `"allow_partial"`},
		{"mistyped field", "POST", "/admin/v1/projections/accounts/rebuilds", `{"allow_partial_history": "yes"}`, 400, "bad_request", "allow_partial_history"},
		{"not JSON", "POST", "/admin/v1/projections/accounts/rebuilds", `{`, 400, "bad_request", "JSON"},
		{"bad retain", "POST", "/admin/v1/projections/accounts/rebuilds", `{"retain": "soon"}`, 400, "bad_request", "retain"},
		{"schema path", "POST", "/admin/v1/projections/accounts/rebuilds", `{"definition": {"name": "accounts", "schema": "a.avsc"}}`, 400, rebuild.CodeBadDefinition, "reader_schema"},
		{"definition without mode", "POST", "/admin/v1/projections/accounts/rebuilds",
			`{"definition": {"name": "accounts", "topic": "accounts.events", "table": "accounts", "key": "account_id", "columns": {"account_id": {"type": "text", "primary_key": true}}}}`,
			400, rebuild.CodeBadDefinition, "mode"},
		{"definition of another projection", "POST", "/admin/v1/projections/accounts/rebuilds",
			`{"definition": {"name": "orders", "topic": "accounts.events", "table": "accounts", "key": "account_id", "mode": "snapshot", "columns": {"account_id": {"type": "text", "primary_key": true}}}}`,
			400, rebuild.CodeBadDefinition, "orders"},
		{"unknown definition key", "POST", "/admin/v1/projections/accounts/rebuilds", `{"definition": {"name": "accounts", "tabel": "x"}}`, 400, rebuild.CodeBadDefinition, "tabel"},
		{"nothing to roll back", "POST", "/admin/v1/projections/accounts/rollbacks", "", 409, rebuild.CodeNothingRetired, "accounts"},
		{"too large", "POST", "/admin/v1/projections/accounts/rebuilds", `{"actor": "` + strings.Repeat("a", 1<<20) + `"}`, 413, "bad_request", "larger"},
		{"unknown path", "GET", "/admin/v1/nothing", "", 404, "not_found", "/admin/v1/nothing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := call(t, srv, tc.method, tc.path, tc.body)
			code, msg := errorOf(t, body)
			if status != tc.status || code != tc.code || !strings.Contains(msg, tc.says) {
				t.Errorf("%d %s %q, want %d %s saying %q", status, code, msg, tc.status, tc.code, tc.says)
			}
		})
	}
	// Nothing of those started an operation.
	_, _, list := call(t, srv, "GET", "/admin/v1/operations", "")
	if ops, _ := list["operations"].([]any); len(ops) != 0 {
		t.Errorf("operations after refusals: %v", ops)
	}
}

// TestParseDefinitionKeepsColumnOrder: the definition sent as JSON keeps
// its columns in the order given, as a projection file would.
func TestParseDefinitionKeepsColumnOrder(t *testing.T) {
	d, err := rebuild.ParseDefinition([]byte(`{"name": "accounts", "topic": "accounts.events", "table": "accounts", "key": "account_id", "mode": "snapshot",
		"columns": {"zeta": {"type": "text"}, "account_id": {"type": "text", "primary_key": true}, "alpha": {"type": "bigint"}}}`), `{"type": "record", "name": "A", "fields": []}`)
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.Compile(nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range p.Columns {
		names = append(names, c.Name)
	}
	if got := strings.Join(names, ","); !strings.HasPrefix(got, "account_id,zeta,alpha") {
		t.Errorf("columns %s, want the key, then zeta and alpha as given", got)
	}
	if p.Schema == "" {
		t.Error("the reader schema was dropped")
	}
}
