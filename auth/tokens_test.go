package auth

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// syncBuffer is a log destination the race detector accepts.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func testLog() (*slog.Logger, *syncBuffer) {
	var buf syncBuffer
	return slog.New(slog.NewTextHandler(&buf, nil)), &buf
}

// request returns a request bearing token, or no Authorization header if
// token is empty.
func request(token string) *http.Request {
	r := httptest.NewRequest("GET", "/v1/projections/orders/rows/1", nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	return r
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	// Write then rename, as a deployment replaces a file: a reader never
	// sees half of it.
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

const (
	tokenA = "alpha-token-0123456789abcdefghijklmnopqrstu"
	tokenB = "bravo-token-0123456789abcdefghijklmnopqrstu"
)

func TestAuthTokenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	writeFile(t, path, `
tokens:
  - name: billing
    hash: `+HashToken(tokenA)+`
    scopes: [read:invoices, read:customers]
    tenant: acme
  - name: ops
    hash: `+HashToken(tokenB)+`
    scopes: [admin, "read:*"]
`)
	log, _ := testLog()
	clock := newFakeClock()
	a, err := NewTokenFile(path, log, clock.now)
	if err != nil {
		t.Fatal(err)
	}
	p, err := a.Authenticate(request(tokenA))
	if err != nil {
		t.Fatal(err)
	}
	if p.Subject != "billing" || p.Tenant != "acme" || !p.Allows(ReadScope("invoices")) || p.Allows(ReadScope("orders")) || p.Allows(ScopeAdmin) {
		t.Errorf("billing's principal = %+v", p)
	}
	p, err = a.Authenticate(request(tokenB))
	if err != nil {
		t.Fatal(err)
	}
	if p.Subject != "ops" || p.Tenant != "" || !p.Allows(ScopeAdmin) || !p.Allows(ReadScope("orders")) {
		t.Errorf("ops's principal = %+v", p)
	}

	for name, tc := range map[string]struct{ header, want string }{
		"no header":     {"", "no Authorization header"},
		"basic":         {"Basic " + tokenA, "not of the Bearer scheme"},
		"empty bearer":  {"Bearer ", "empty bearer token"},
		"unknown token": {"Bearer " + tokenA + "x", "unknown token"},
		"the hash":      {"Bearer " + HashToken(tokenA), "unknown token"},
	} {
		t.Run(name, func(t *testing.T) {
			r := request("")
			if tc.header != "" {
				r.Header.Set("Authorization", tc.header)
			}
			_, err := a.Authenticate(r)
			if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrUnauthenticated saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), tokenA) {
				t.Errorf("the error quotes the token: %v", err)
			}
		})
	}
}

func TestAuthTokenFileErrors(t *testing.T) {
	hashA := HashToken(tokenA)
	for name, tc := range map[string]struct{ content, want string }{
		"empty":          {``, "no tokens"},
		"unknown field":  {"tokens:\n  - name: a\n    hash: " + hashA + "\n    scope: [admin]\n", "field scope not found"},
		"no name":        {"tokens:\n  - hash: " + hashA + "\n    scopes: [admin]\n", "token 1: name: missing"},
		"no hash":        {"tokens:\n  - name: a\n    scopes: [admin]\n", "token 1 (a): hash: missing"},
		"plaintext":      {"tokens:\n  - name: a\n    hash: " + tokenA + "\n    scopes: [admin]\n", "token 1 (a): hash: not a hash (it may be a token in the clear"},
		"short hash":     {"tokens:\n  - name: a\n    hash: sha256:abc\n    scopes: [admin]\n", "token 1 (a): hash: want sha256: and 64 lower-case hex digits"},
		"no scopes":      {"tokens:\n  - name: a\n    hash: " + hashA + "\n", "token 1 (a): scopes: missing"},
		"unknown scope":  {"tokens:\n  - name: a\n    hash: " + hashA + "\n    scopes: [write:orders]\n", `token 1 (a): scopes: unknown scope "write:orders"`},
		"bad projection": {"tokens:\n  - name: a\n    hash: " + hashA + "\n    scopes: [read:Orders]\n", `token 1 (a): scopes: scope "read:Orders": "Orders" is not a projection name`},
		"duplicate hash": {"tokens:\n  - name: a\n    hash: " + hashA + "\n    scopes: [admin]\n  - name: b\n    hash: " + hashA + "\n    scopes: [admin]\n", "token 2 (b): hash: the same as token 1 (a)'s"},
		"duplicate name": {"tokens:\n  - name: a\n    hash: " + hashA + "\n    scopes: [admin]\n  - name: a\n    hash: " + HashToken(tokenB) + "\n    scopes: [admin]\n", "token 2 (a): name: already given to token 1"},
		"json":           {`{"tokens": [{"name": "a", "hash": "` + hashA + `", "scopes": ["read:*", "bogus"]}]}`, `token 1 (a): scopes: unknown scope "bogus"`},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tokens.yaml")
			writeFile(t, path, tc.content)
			log, _ := testLog()
			_, err := NewTokenFile(path, log, nil)
			if err == nil || !strings.Contains(err.Error(), "token file "+path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming the file and saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), tokenA) {
				t.Errorf("the error quotes a token in the clear: %v", err)
			}
		})
	}
}

func TestAuthTokenFileJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.json")
	writeFile(t, path, `{"tokens": [{"name": "a", "hash": "`+HashToken(tokenA)+`", "scopes": ["read:orders"], "tenant": "t1"}]}`)
	log, _ := testLog()
	a, err := NewTokenFile(path, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := a.Authenticate(request(tokenA)); err != nil || p.Subject != "a" || p.Tenant != "t1" {
		t.Fatalf("Authenticate = %+v, %v", p, err)
	}
}

func TestAuthTokenFileReread(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	entry := func(name, token string) string {
		return "  - name: " + name + "\n    hash: " + HashToken(token) + "\n    scopes: [\"read:*\"]\n"
	}
	writeFile(t, path, "tokens:\n"+entry("a", tokenA))
	log, logged := testLog()
	clock := newFakeClock()
	a, err := NewTokenFile(path, log, clock.now)
	if err != nil {
		t.Fatal(err)
	}
	authenticates := func(token string) bool {
		_, err := a.Authenticate(request(token))
		if err != nil && !errors.Is(err, ErrUnauthenticated) {
			t.Fatal(err)
		}
		return err == nil
	}

	// Rotation: b added, a removed.
	writeFile(t, path, "tokens:\n"+entry("b", tokenB))
	if !authenticates(tokenA) || authenticates(tokenB) {
		t.Fatal("the file was read again before a second passed")
	}
	clock.add(time.Second)
	if authenticates(tokenA) || !authenticates(tokenB) {
		t.Fatal("the changed file was not taken up after a second")
	}

	// A change that does not parse keeps the tokens, and is logged once.
	writeFile(t, path, "tokens:\n  - name: c\n    hash: oops\n")
	for range 3 {
		clock.add(time.Second)
		if !authenticates(tokenB) {
			t.Fatal("a file that does not parse replaced the tokens")
		}
	}
	if n := strings.Count(logged.String(), "does not parse"); n != 1 {
		t.Errorf("the bad file was logged %d times, want once:\n%s", n, logged)
	}
	if !strings.Contains(logged.String(), "token 1 (c): hash") {
		t.Errorf("the log does not say what is wrong:\n%s", logged)
	}

	// Fixed again, the file is taken up.
	writeFile(t, path, "tokens:\n"+entry("a", tokenA))
	clock.add(time.Second)
	if !authenticates(tokenA) || authenticates(tokenB) {
		t.Fatal("the fixed file was not taken up")
	}

	// A file removed keeps the tokens, logged once.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		clock.add(time.Second)
		if !authenticates(tokenA) {
			t.Fatal("a removed file dropped the tokens")
		}
	}
	if n := strings.Count(logged.String(), "not read again"); n != 1 {
		t.Errorf("the removed file was logged %d times, want once:\n%s", n, logged)
	}
}

func TestAuthHashToken(t *testing.T) {
	// sha256("test") as sha256sum prints it.
	if got, want := HashToken("test"), "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"; got != want {
		t.Errorf("HashToken(test) = %s, want %s", got, want)
	}
	a, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewToken()
	if len(a) != 43 || a == b {
		t.Errorf("NewToken gave %q and %q: want two different 43-character tokens", a, b)
	}
}

func TestAuthAllows(t *testing.T) {
	all := Principal{Scopes: []string{ScopeReadAll}}
	if !all.Allows(ReadScope("orders")) || all.Allows(ScopeAdmin) {
		t.Error("read:* must cover read:<projection> and not admin")
	}
	admin := Principal{Scopes: []string{ScopeAdmin}}
	if admin.Allows(ReadScope("orders")) {
		t.Error("admin must not cover reads")
	}
	one := Principal{Scopes: []string{ReadScope("orders")}}
	if !one.Allows(ReadScope("orders")) || one.Allows(ReadScope("invoices")) || one.Allows(ScopeReadAll) {
		t.Error("read:orders must cover read:orders only")
	}
}

// Requests authenticate while the file is rewritten: the race detector
// judges the sharing, and every request sees one set or the other.
func TestAuthTokenFileConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	file := "tokens:\n  - name: a\n    hash: " + HashToken(tokenA) + "\n    scopes: [admin]\n"
	writeFile(t, path, file)
	log, _ := testLog()
	clock := newFakeClock()
	a, err := NewTokenFile(path, log, clock.now)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				if p, err := a.Authenticate(request(tokenA)); err != nil || p.Subject != "a" {
					t.Errorf("Authenticate = %+v, %v", p, err)
					return
				}
			}
		})
	}
	for i := range 20 {
		clock.add(time.Second)
		writeFile(t, path, file+strings.Repeat("\n", i%2)) // another size: read again
	}
	wg.Wait()
}
