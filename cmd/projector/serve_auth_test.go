package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/projector-dev/projector/auth"
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
	dir := t.TempDir()
	config := filepath.Join(dir, "projections.yaml")
	file := bytes.Replace(demo.Projections, []byte("    mode: fold"), []byte("    tenant: owner\n    mode: fold"), 1)
	if err := os.WriteFile(config, file, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runCaptured(ctx, "migrate", "--database-url", db.URL, "--config", config); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO accounts (account_id, owner, balance, version)
		VALUES ('a-1', 'ada', 10, 3), ('a-2', 'ada', 20, 1), ('g-1', 'grace', 30, 2)`); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{}
	for _, name := range []string{"reader", "ada", "other"} {
		tok, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = tok
	}
	tokenFile := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokenFile, fmt.Appendf(nil, `tokens:
  - {name: reader, hash: %q, scopes: ["read:*"]}
  - {name: ada-service, hash: %q, scopes: ["read:accounts"], tenant: ada}
  - {name: other, hash: %q, scopes: ["read:customers"]}
`, auth.HashToken(tokens["reader"]), auth.HashToken(tokens["ada"]), auth.HashToken(tokens["other"])), 0o600); err != nil {
		t.Fatal(err)
	}

	api, health := freeAddr(t), freeAddr(t)
	srv := startChild(t, "serve", "--database-url", db.URL, "--config", config,
		"--auth", "tokens", "--auth-token-file", tokenFile, "--api-addr", api, "--http-addr", health)
	awaitServeReady(t, srv, health)

	get := func(token, path string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+api+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("GET %s: %q: %v", path, body, err)
		}
		return resp.StatusCode, m
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
		{"ada's tenant, her row", tokens["ada"], "/v1/projections/accounts/rows/a-1", http.StatusOK, ""},
		{"ada's tenant, grace's row", tokens["ada"], "/v1/projections/accounts/rows/g-1", http.StatusNotFound, "not_found"},
		{"ada's tenant, no such row", tokens["ada"], "/v1/projections/accounts/rows/x-9", http.StatusNotFound, "not_found"},
	} {
		status, body := get(c.token, c.path)
		if status != c.status || c.code != "" && body["code"] != c.code {
			t.Errorf("%s: GET %s: %d %v, want %d %s", c.who, c.path, status, body, c.status, c.code)
		}
	}
	// Another tenant's row and a missing one answer alike, but for the
	// key the detail names.
	_, other := get(tokens["ada"], "/v1/projections/accounts/rows/g-1")
	_, missing := get(tokens["ada"], "/v1/projections/accounts/rows/x-9")
	delete(other, "detail")
	delete(missing, "detail")
	delete(other, "instance")
	delete(missing, "instance")
	if fmt.Sprint(other) != fmt.Sprint(missing) {
		t.Errorf("another tenant's row %v differs from a missing one %v", other, missing)
	}

	for who, want := range map[string]int{"reader": 3, "ada": 2} {
		status, list := get(tokens[who], "/v1/projections/accounts/rows")
		if status != http.StatusOK {
			t.Fatalf("%s lists: %d %v", who, status, list)
		}
		if n := len(list["rows"].([]any)); n != want {
			t.Errorf("%s lists %d rows, want %d", who, n, want)
		}
	}
}
