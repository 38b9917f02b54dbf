package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/projector-dev/projector/auth"
	"github.com/projector-dev/projector/internal/testenv"
)

// migrated writes projections as a projection file, migrates db's
// tables from it, and returns the file's path.
func migrated(t *testing.T, db *testenv.DB, projections []byte) string {
	t.Helper()
	config := filepath.Join(t.TempDir(), "projections.yaml")
	if err := os.WriteFile(config, projections, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runCaptured(t.Context(), "migrate", "--database-url", db.URL, "--config", config); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	return config
}

// tokenLine is a token of a token file: its name, and its other fields
// but the hash, in YAML (scopes: [...], tenant: ...).
type tokenLine struct{ name, fields string }

// writeTokens writes a token file with a new token for each line, and
// returns its path and the tokens by name.
func writeTokens(t *testing.T, lines ...tokenLine) (string, map[string]string) {
	t.Helper()
	tokens := map[string]string{}
	file := []byte("tokens:\n")
	for _, l := range lines {
		tok, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		tokens[l.name] = tok
		file = fmt.Appendf(file, "  - {name: %s, hash: %q, %s}\n", l.name, auth.HashToken(tok), l.fields)
	}
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, tokens
}

// askJSON sends method url with body, and token as a bearer token
// unless empty, and decodes the JSON object answered.
func askJSON(ctx context.Context, t *testing.T, method, url, token, body string) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
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
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s %s: %q: %v", method, url, b, err)
	}
	return resp.StatusCode, resp.Header, m
}
