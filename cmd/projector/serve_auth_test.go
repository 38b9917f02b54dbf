package main

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
)

// TestServeWithATokenFile: projector serve with --auth tokens answers 401
// without a token or with an unknown one, 403 to a token without the
// projection's scope, and a tenant-bound token sees only its tenant's
// rows: another tenant's row is a 404 in the same shape as a missing
// one, and lists are filtered.
func TestServeWithATokenFile(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	config := migrated(t, db, bytes.Replace(demo.Projections, []byte("    mode: fold"), []byte("    tenant: owner\n    mode: fold"), 1))
	if _, err := db.Pool.Exec(ctx, `INSERT INTO accounts (account_id, owner, balance, version)
		VALUES ('a-1', 'ada', 10, 3), ('a-2', 'ada', 20, 1), ('g-1', 'grace', 30, 2)`); err != nil {
		t.Fatal(err)
	}
	tokenFile, tokens := writeTokens(t,
		tokenLine{"reader", `scopes: ["read:*"]`},
		tokenLine{"ada-service", `scopes: ["read:accounts"], tenant: ada`},
		tokenLine{"other", `scopes: ["read:customers"]`})

	api, health := freeAddr(t), freeAddr(t)
	srv := startChild(t, "serve", "--database-url", db.URL, "--config", config,
		"--auth", "tokens", "--auth-token-file", tokenFile, "--api-addr", api, "--http-addr", health)
	awaitServeReady(t, srv, health)

	get := func(token, path string) (int, map[string]any) {
		t.Helper()
		status, _, body := askJSON(ctx, t, http.MethodGet, "http://"+api+path, token, "")
		return status, body
	}
	for _, c := range []struct {
		who, token, path string
		status           int
		code             string
	}{
		{"no token", "", "/v1/projections/accounts/rows/a-1", http.StatusUnauthorized, "unauthenticated"},
		{"an unknown token", "not-a-token-of-the-file", "/v1/projections/accounts/rows/a-1", http.StatusUnauthorized, "unauthenticated"},
		{"a token without read:accounts", tokens["other"], "/v1/projections/accounts/rows/a-1", http.StatusForbidden, "forbidden"},
		{"read:*", tokens["reader"], "/v1/projections/accounts/rows/g-1", http.StatusOK, ""},
		{"ada's tenant, her row", tokens["ada-service"], "/v1/projections/accounts/rows/a-1", http.StatusOK, ""},
		{"ada's tenant, grace's row", tokens["ada-service"], "/v1/projections/accounts/rows/g-1", http.StatusNotFound, "not_found"},
		{"ada's tenant, no such row", tokens["ada-service"], "/v1/projections/accounts/rows/x-9", http.StatusNotFound, "not_found"},
	} {
		status, body := get(c.token, c.path)
		if status != c.status || c.code != "" && body["code"] != c.code {
			t.Errorf("%s: GET %s: %d %v, want %d %s", c.who, c.path, status, body, c.status, c.code)
		}
	}
	// Another tenant's row and a missing one answer alike, but for the
	// key the detail names.
	_, other := get(tokens["ada-service"], "/v1/projections/accounts/rows/g-1")
	_, missing := get(tokens["ada-service"], "/v1/projections/accounts/rows/x-9")
	delete(other, "detail")
	delete(missing, "detail")
	delete(other, "instance")
	delete(missing, "instance")
	if fmt.Sprint(other) != fmt.Sprint(missing) {
		t.Errorf("another tenant's row %v differs from a missing one %v", other, missing)
	}

	for who, want := range map[string]int{"reader": 3, "ada-service": 2} {
		status, list := get(tokens[who], "/v1/projections/accounts/rows")
		if status != http.StatusOK {
			t.Fatalf("%s lists: %d %v", who, status, list)
		}
		if n := len(list["rows"].([]any)); n != want {
			t.Errorf("%s lists %d rows, want %d", who, n, want)
		}
	}
}
