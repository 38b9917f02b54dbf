package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/projector-dev/projector/adminapi"
	"github.com/projector-dev/projector/auth"
	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
)

// TestServeAdminAPI: projector serve answers the admin API on its API
// port with the read API's token file: a read token is refused (403), the
// admin token lists and purges dead letters, the purge's audit row names
// the token, offset resets answer 501 without brokers, the admin routes
// are counted as the read routes are, and the document at /openapi.json
// describes each admin route served.
func TestServeAdminAPI(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	config := migrated(t, db, demo.Projections)
	var id int64
	if err := db.Pool.QueryRow(ctx, `INSERT INTO projector_dead_letters
		(identity, projection, topic, partition, "offset", record_key, value, error, error_class)
		VALUES ('projector', 'accounts', 'accounts.events', 0, 7, 'a-1', 'x', 'boom', 'decode') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	tokenFile, tokens := writeTokens(t,
		tokenLine{"reader", `scopes: ["read:*"]`},
		tokenLine{"ops-console", `scopes: ["admin"]`})
	api, health := freeAddr(t), freeAddr(t)
	srv := startChild(t, "serve", "--database-url", db.URL, "--config", config,
		"--auth", "tokens", "--auth-token-file", tokenFile, "--api-addr", api, "--http-addr", health)
	awaitServeReady(t, srv, health)
	do := func(token, method, path, body string) (int, map[string]any) {
		t.Helper()
		status, _, m := askJSON(ctx, t, method, "http://"+api+path, token, body)
		return status, m
	}
	if code, body := do(tokens["reader"], "GET", "/admin/v1/dead-letters", ""); code != http.StatusForbidden || body["code"] != "forbidden" {
		t.Errorf("a read token: %d %v, want 403 forbidden", code, body)
	}
	code, body := do(tokens["ops-console"], "GET", "/admin/v1/dead-letters?projection=accounts", "")
	if code != http.StatusOK || len(body["dead_letters"].([]any)) != 1 {
		t.Fatalf("the admin token lists: %d %v, want the dead letter", code, body)
	}
	if code, body := do(tokens["ops-console"], "POST", "/admin/v1/dead-letters/purges", fmt.Sprintf(`{"ids":[%d]}`, id)); code != http.StatusOK {
		t.Fatalf("purge: %d %v", code, body)
	}
	audit, err := deadletters.ListAudit(ctx, db.Pool, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(audit) != 1 || audit[0].Actor != "ops-console" || audit[0].Action != deadletters.AuditPurge || audit[0].DBUser != "postgres" {
		t.Errorf("audit: %+v, want the purge by ops-console as postgres", audit)
	}
	if code, body := do(tokens["ops-console"], "POST", "/admin/v1/offsets/resets", `{"topic":"accounts.events","to":"earliest"}`); code != http.StatusNotImplemented || body["code"] != "not_served" {
		t.Errorf("an offset reset from serve: %d %v, want 501 not_served", code, body)
	}
	// The served document describes every admin route, as it describes
	// exactly what the process serves.
	docResp, err := http.Get("http://" + api + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	err = json.NewDecoder(docResp.Body).Decode(&doc)
	docResp.Body.Close()
	if err != nil {
		t.Fatalf("/openapi.json: %v", err)
	}
	admin, err := adminapi.Handler(adminapi.Config{DB: db.Pool, Identity: "projector", Authenticator: auth.None{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, route := range admin.Routes() {
		method, path, _ := strings.Cut(route, " ")
		if doc.Paths[path][strings.ToLower(method)] == nil {
			t.Errorf("serve's /openapi.json does not describe %s", route)
		}
	}
	// A read still answers through the read-only pool.
	if code, body := do(tokens["reader"], "GET", "/v1/projections/accounts/rows", ""); code != http.StatusOK {
		t.Errorf("a read beside the admin API: %d %v", code, body)
	}
	resp, err := http.Get("http://" + health + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	metrics, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`projector_http_requests_total{code="403",route="/admin/v1/dead-letters"} 1`,
		`projector_http_requests_total{code="200",route="/admin/v1/dead-letters/purges"} 1`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
}
