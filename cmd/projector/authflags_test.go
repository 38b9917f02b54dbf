package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/projector-dev/projector/auth"
)

// authFrom parses args into a throwaway flag set and returns the
// authenticator, and what was logged.
func authFrom(t *testing.T, args ...string) (auth.Authenticator, string, error) {
	t.Helper()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var a authFlags
	a.register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	au, err := a.authenticator(slog.New(slog.NewTextHandler(&logged, nil)))
	return au, logged.String(), err
}

func TestAuthFlags(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.yaml")
	const token = "a-token-of-the-test-0123456789abcdefghijk"
	if err := os.WriteFile(tokens, []byte("tokens:\n  - name: svc\n    hash: "+auth.HashToken(token)+"\n    scopes: [read:orders]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	jwks := filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(jwks, []byte(`{"keys":[{"kty":"oct","kid":"k1","alg":"HS256","k":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("default needs a token file", func(t *testing.T) {
		_, _, err := authFrom(t)
		if err == nil || !strings.Contains(err.Error(), "--auth tokens needs --auth-token-file ("+envName("--auth-token-file")+")") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("tokens", func(t *testing.T) {
		a, _, err := authFrom(t, "--auth-token-file", tokens)
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Authorization", "Bearer "+token)
		if p, err := a.Authenticate(r); err != nil || p.Subject != "svc" {
			t.Fatalf("Authenticate = %+v, %v", p, err)
		}
		if _, err := a.Authenticate(httptest.NewRequest("GET", "/", nil)); !errors.Is(err, auth.ErrUnauthenticated) {
			t.Fatalf("no token: err = %v", err)
		}
	})
	t.Run("none warns", func(t *testing.T) {
		a, logged, err := authFrom(t, "--auth", "none")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := a.(auth.None); !ok {
			t.Errorf("authenticator %T, want auth.None", a)
		}
		if strings.Count(logged, "level=WARN") != 1 || !strings.Contains(logged, "not authenticated") {
			t.Errorf("want one warning, logged:\n%s", logged)
		}
	})
	t.Run("jwt", func(t *testing.T) {
		a, _, err := authFrom(t, "--auth", "jwt", "--auth-jwks-file", jwks, "--auth-issuer", "https://idp.example.com/", "--auth-audience", "projector")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := a.(*auth.JWT); !ok {
			t.Errorf("authenticator %T, want *auth.JWT", a)
		}
	})
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"unknown mode":       {[]string{"--auth", "basic"}, `--auth "basic" (` + envName("--auth") + `): want tokens, jwt or none`},
		"empty mode":         {[]string{"--auth", ""}, `--auth "" (` + envName("--auth") + `): want tokens, jwt or none`},
		"jwt flag on tokens": {[]string{"--auth-token-file", tokens, "--auth-issuer", "x"}, "--auth-issuer (" + envName("--auth-issuer") + ") is for --auth jwt, and --auth is tokens"},
		"token file on none": {[]string{"--auth", "none", "--auth-token-file", tokens}, "--auth-token-file (" + envName("--auth-token-file") + ") is for --auth tokens, and --auth is none"},
		"jwt without keys":   {[]string{"--auth", "jwt", "--auth-issuer", "i", "--auth-audience", "a"}, "--auth jwt: JWT authentication needs exactly one source of keys"},
		"jwt without issuer": {[]string{"--auth", "jwt", "--auth-jwks-file", jwks, "--auth-audience", "a"}, "needs --auth-issuer"},
		"missing token file": {[]string{"--auth-token-file", filepath.Join(dir, "nope.yaml")}, "read token file"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := authFrom(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestAuthCommands(t *testing.T) {
	run := func(stdin string, args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := authCommand(strings.NewReader(stdin), &out, &errOut).ParseAndRun(context.Background(), args)
		return out.String(), err
	}
	out, err := run("test\n", "hash-token")
	if err != nil {
		t.Fatal(err)
	}
	// sha256("test"), as sha256sum prints it.
	if want := "hash: sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n"; out != want {
		t.Errorf("hash-token printed %q, want %q", out, want)
	}
	for name, tc := range map[string]struct {
		stdin string
		args  []string
		want  string
	}{
		"empty stdin":     {"", []string{"hash-token"}, "no token on stdin"},
		"token as an arg": {"", []string{"hash-token", "secret"}, "reads the token from stdin"},
		"spaces":          {" secret \n", []string{"hash-token"}, "begins or ends with spaces"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := run(tc.stdin, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secret") && !strings.Contains(tc.want, "secret") {
				t.Fatalf("err = %v, want one saying %q", err, tc.want)
			}
		})
	}

	// A new token is accepted by a file holding the hash printed with it.
	out, err = run("", "new-token")
	if err != nil {
		t.Fatal(err)
	}
	var token, hash string
	if _, err := fmt.Sscanf(out, "token: %s\nhash: %s\n", &token, &hash); err != nil {
		t.Fatalf("new-token printed %q: %v", out, err)
	}
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := os.WriteFile(path, []byte("tokens:\n  - name: new\n    hash: "+hash+"\n    scopes: [admin]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := auth.NewTokenFile(path, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	if p, err := a.Authenticate(r); err != nil || p.Subject != "new" {
		t.Fatalf("the new token: %+v, %v", p, err)
	}
}
