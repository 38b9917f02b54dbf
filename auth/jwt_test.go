package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"
)

const (
	testIssuer   = "https://idp.example.com/"
	testAudience = "projector"
)

// testKeys are the signing keys of an identity provider in a test.
type testKeys struct {
	rsa  *rsa.PrivateKey
	ec   *ecdsa.PrivateKey
	hmac []byte
}

var (
	keysOnce   sync.Once
	sharedKeys testKeys
)

// newTestKeys generates keys once per test binary: RSA keys take a while
// under the race detector.
func newTestKeys(t testing.TB) testKeys {
	t.Helper()
	keysOnce.Do(func() {
		var err error
		if sharedKeys.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if sharedKeys.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			panic(err)
		}
		sharedKeys.hmac = []byte("0123456789abcdef0123456789abcdef-hmac")
	})
	return sharedKeys
}

// jwks returns a JWK Set of the public halves of keys by kid.
func jwks(t testing.TB, keys map[string]any) string {
	t.Helper()
	var set jwkset.JWKSMarshal
	for kid, k := range keys {
		opts := jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: kid, USE: jwkset.UseSig}}
		switch k := k.(type) {
		case *rsa.PrivateKey:
			jwk, err := jwkset.NewJWKFromKey(&k.PublicKey, opts)
			if err != nil {
				t.Fatal(err)
			}
			set.Keys = append(set.Keys, jwk.Marshal())
		case *ecdsa.PrivateKey:
			jwk, err := jwkset.NewJWKFromKey(&k.PublicKey, opts)
			if err != nil {
				t.Fatal(err)
			}
			set.Keys = append(set.Keys, jwk.Marshal())
		case []byte:
			opts.Marshal.Private = true
			jwk, err := jwkset.NewJWKFromKey(k, opts)
			if err != nil {
				t.Fatal(err)
			}
			set.Keys = append(set.Keys, jwk.Marshal())
		}
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sign returns a JWT of claims signed by key with method, kid in its
// header when not empty.
func sign(t testing.TB, method jwt.SigningMethod, kid string, key any, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// claimsAt are valid claims at now.
func claimsAt(now time.Time) jwt.MapClaims {
	return jwt.MapClaims{
		"iss":    testIssuer,
		"aud":    []string{testAudience, "other-service"},
		"sub":    "svc-billing",
		"exp":    now.Add(5 * time.Minute).Unix(),
		"nbf":    now.Add(-time.Minute).Unix(),
		"iat":    now.Add(-time.Minute).Unix(),
		"scope":  "read:invoices openid read:customers",
		"tenant": "acme",
	}
}

func jwksFileAuth(t testing.TB, clock *fakeClock, keys map[string]any) (*JWT, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "jwks.json")
	writeFile(t, path, jwks(t, keys))
	log, _ := testLog()
	a, err := NewJWT(JWTConfig{JWKSFile: path, Issuer: testIssuer, Audience: testAudience, TenantClaim: "tenant", Log: log, Now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	return a, path
}

func TestAuthJWTAlgorithms(t *testing.T) {
	k := newTestKeys(t)
	clock := newFakeClock()
	a, _ := jwksFileAuth(t, clock, map[string]any{"rsa-1": k.rsa, "ec-1": k.ec, "oct-1": k.hmac})
	for _, tc := range []struct {
		method jwt.SigningMethod
		kid    string
		key    any
	}{
		{jwt.SigningMethodRS256, "rsa-1", k.rsa},
		{jwt.SigningMethodES256, "ec-1", k.ec},
		{jwt.SigningMethodHS256, "oct-1", k.hmac},
		{jwt.SigningMethodRS256, "", k.rsa}, // no kid: the keys of the algorithm's type are tried
		{jwt.SigningMethodES256, "", k.ec},
	} {
		t.Run(tc.method.Alg()+"/"+tc.kid, func(t *testing.T) {
			p, err := a.Authenticate(request(sign(t, tc.method, tc.kid, tc.key, claimsAt(clock.now()))))
			if err != nil {
				t.Fatal(err)
			}
			if p.Subject != "svc-billing" || p.Tenant != "acme" || strings.Join(p.Scopes, " ") != "read:invoices read:customers" {
				t.Errorf("principal = %+v", p)
			}
		})
	}
}

func TestAuthJWTRefused(t *testing.T) {
	k := newTestKeys(t)
	clock := newFakeClock()
	a, _ := jwksFileAuth(t, clock, map[string]any{"rsa-1": k.rsa, "ec-1": k.ec})
	now := clock.now()
	with := func(change func(jwt.MapClaims)) jwt.MapClaims {
		c := claimsAt(now)
		change(c)
		return c
	}
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaPublicDER, err := x509.MarshalPKIXPublicKey(&k.rsa.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	unsigned, err := jwt.NewWithClaims(jwt.SigningMethodNone, claimsAt(now)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		token, want string
	}{
		"other issuer":   {sign(t, jwt.SigningMethodRS256, "rsa-1", k.rsa, with(func(c jwt.MapClaims) { c["iss"] = "https://evil.example.com/" })), "another issuer"},
		"other audience": {sign(t, jwt.SigningMethodRS256, "rsa-1", k.rsa, with(func(c jwt.MapClaims) { c["aud"] = "billing" })), "another audience"},
		"expired":        {sign(t, jwt.SigningMethodRS256, "rsa-1", k.rsa, with(func(c jwt.MapClaims) { c["exp"] = now.Add(-31 * time.Second).Unix() })), "token expired"},
		"no exp":         {sign(t, jwt.SigningMethodRS256, "rsa-1", k.rsa, with(func(c jwt.MapClaims) { delete(c, "exp") })), "without an exp"},
		"not yet valid":  {sign(t, jwt.SigningMethodRS256, "rsa-1", k.rsa, with(func(c jwt.MapClaims) { c["nbf"] = now.Add(31 * time.Second).Unix() })), "not valid yet"},
		"no sub":         {sign(t, jwt.SigningMethodRS256, "rsa-1", k.rsa, with(func(c jwt.MapClaims) { delete(c, "sub") })), "no sub claim"},
		"alg none":       {unsigned, "algorithm not accepted"},
		"RS384":          {sign(t, jwt.SigningMethodRS384, "rsa-1", k.rsa, claimsAt(now)), "algorithm not accepted"},
		// The classic confusion: an HMAC whose secret is the RSA public
		// key, which anyone may know.
		"HS256 with the RSA public key":     {sign(t, jwt.SigningMethodHS256, "rsa-1", rsaPublicDER, claimsAt(now)), "not of the type its algorithm needs"},
		"HS256 with the RSA key, no kid":    {sign(t, jwt.SigningMethodHS256, "", rsaPublicDER, claimsAt(now)), "no key verifies"},
		"ES256 under the RSA key's kid":     {sign(t, jwt.SigningMethodES256, "rsa-1", k.ec, claimsAt(now)), "not of the type its algorithm needs"},
		"signed by another key, same kid":   {sign(t, jwt.SigningMethodES256, "ec-1", other, claimsAt(now)), "signature not valid"},
		"signed by another key, no kid":     {sign(t, jwt.SigningMethodES256, "", other, claimsAt(now)), "signature not valid"},
		"unknown kid":                       {sign(t, jwt.SigningMethodES256, "ec-2", other, claimsAt(now)), "unknown key"},
		"malformed":                         {"not.a.jwt", "malformed token"},
		"scope claim of the wrong type":     {sign(t, jwt.SigningMethodRS256, "rsa-1", k.rsa, with(func(c jwt.MapClaims) { c["scope"] = 7 })), "neither a string nor an array"},
		"tenant claim of the wrong type":    {sign(t, jwt.SigningMethodRS256, "rsa-1", k.rsa, with(func(c jwt.MapClaims) { c["tenant"] = []string{"a", "b"} })), "tenant claim is not a string"},
		"signature of another token's body": {tamper(sign(t, jwt.SigningMethodRS256, "rsa-1", k.rsa, claimsAt(now))), "signature not valid"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := a.Authenticate(request(tc.token))
			if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrUnauthenticated saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), tc.token) {
				t.Errorf("the error quotes the token: %v", err)
			}
		})
	}

	// Within the leeway, exp and nbf pass.
	for name, c := range map[string]jwt.MapClaims{
		"expired 20s ago":    with(func(c jwt.MapClaims) { c["exp"] = now.Add(-20 * time.Second).Unix() }),
		"valid in 20s":       with(func(c jwt.MapClaims) { c["nbf"] = now.Add(20 * time.Second).Unix() }),
		"aud a plain string": with(func(c jwt.MapClaims) { c["aud"] = testAudience }),
	} {
		if _, err := a.Authenticate(request(sign(t, jwt.SigningMethodRS256, "rsa-1", k.rsa, c))); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// tamper changes a signed token's claims, keeping its signature.
func tamper(token string) string {
	parts := strings.Split(token, ".")
	body, _ := jwt.NewParser().DecodeSegment(parts[1])
	var c map[string]any
	_ = json.Unmarshal(body, &c)
	c["scope"] = "admin"
	b, _ := json.Marshal(c)
	parts[1] = base64.RawURLEncoding.EncodeToString(b)
	return strings.Join(parts, ".")
}

func TestAuthJWTScopes(t *testing.T) {
	k := newTestKeys(t)
	clock := newFakeClock()
	now := clock.now()
	path := filepath.Join(t.TempDir(), "jwks.json")
	writeFile(t, path, jwks(t, map[string]any{"ec-1": k.ec}))
	log, _ := testLog()
	for name, tc := range map[string]struct {
		claim string
		set   func(jwt.MapClaims)
		want  string
	}{
		"scope string":       {"", func(c jwt.MapClaims) { c["scope"] = "admin  read:orders offline_access" }, "admin read:orders"},
		"scope array":        {"", func(c jwt.MapClaims) { c["scope"] = []string{"read:*", "email"} }, "read:*"},
		"scp array":          {"", func(c jwt.MapClaims) { delete(c, "scope"); c["scp"] = []string{"read:orders", "admin"} }, "read:orders admin"},
		"scp string":         {"", func(c jwt.MapClaims) { delete(c, "scope"); c["scp"] = "read:orders" }, "read:orders"},
		"no scopes":          {"", func(c jwt.MapClaims) { delete(c, "scope") }, ""},
		"configured claim":   {"permissions", func(c jwt.MapClaims) { c["permissions"] = []string{"admin"} }, "admin"},
		"bad projection out": {"", func(c jwt.MapClaims) { c["scope"] = "read:Orders read:orders" }, "read:orders"},
	} {
		t.Run(name, func(t *testing.T) {
			a, err := NewJWT(JWTConfig{JWKSFile: path, Issuer: testIssuer, Audience: testAudience, ScopeClaim: tc.claim, Log: log, Now: clock.now})
			if err != nil {
				t.Fatal(err)
			}
			c := claimsAt(now)
			tc.set(c)
			p, err := a.Authenticate(request(sign(t, jwt.SigningMethodES256, "ec-1", k.ec, c)))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(p.Scopes, " "); got != tc.want {
				t.Errorf("scopes = %q, want %q", got, tc.want)
			}
			if p.Tenant != "" {
				t.Errorf("tenant %q read without a tenant claim configured", p.Tenant)
			}
		})
	}
}

func TestAuthJWTConfigErrors(t *testing.T) {
	log, _ := testLog()
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	writeFile(t, short, "too short")
	weak := filepath.Join(dir, "weak.json")
	writeFile(t, weak, `{"keys":[{"kty":"oct","kid":"k","k":"c2hvcnQ"}]}`)
	empty := filepath.Join(dir, "empty.json")
	writeFile(t, empty, `{"keys":[]}`)
	for name, tc := range map[string]struct {
		cfg  JWTConfig
		want string
	}{
		"no keys":       {JWTConfig{Issuer: testIssuer, Audience: testAudience}, "exactly one source of keys"},
		"two sources":   {JWTConfig{JWKSFile: empty, JWKSURL: "https://idp.example.com/jwks", Issuer: testIssuer, Audience: testAudience}, "exactly one source of keys"},
		"no issuer":     {JWTConfig{JWKSURL: "https://idp.example.com/jwks", Audience: testAudience}, "--auth-issuer"},
		"no audience":   {JWTConfig{JWKSURL: "https://idp.example.com/jwks", Issuer: testIssuer}, "--auth-audience"},
		"bad URL":       {JWTConfig{JWKSURL: "idp.example.com/jwks", Issuer: testIssuer, Audience: testAudience}, "--auth-jwks-url"},
		"short secret":  {JWTConfig{HMACKeyFile: short, Issuer: testIssuer, Audience: testAudience}, "at least 32"},
		"weak oct key":  {JWTConfig{JWKSFile: weak, Issuer: testIssuer, Audience: testAudience}, `key 1 (kid "k"): oct key of 5 bytes`},
		"no signatures": {JWTConfig{JWKSFile: empty, Issuer: testIssuer, Audience: testAudience}, "no RS256, ES256 or HS256 signature key"},
	} {
		t.Run(name, func(t *testing.T) {
			tc.cfg.Log = log
			if _, err := NewJWT(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestAuthJWTHMACKeyFile(t *testing.T) {
	k := newTestKeys(t)
	clock := newFakeClock()
	path := filepath.Join(t.TempDir(), "hmac.key")
	writeFile(t, path, string(k.hmac))
	log, _ := testLog()
	a, err := NewJWT(JWTConfig{HMACKeyFile: path, Issuer: testIssuer, Audience: testAudience, Log: log, Now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(request(sign(t, jwt.SigningMethodHS256, "", k.hmac, claimsAt(clock.now())))); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(request(sign(t, jwt.SigningMethodRS256, "", k.rsa, claimsAt(clock.now())))); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("an RS256 token against an HMAC key: err = %v, want ErrUnauthenticated", err)
	}
}

func TestAuthJWKSFileReread(t *testing.T) {
	k := newTestKeys(t)
	clock := newFakeClock()
	a, path := jwksFileAuth(t, clock, map[string]any{"ec-1": k.ec})
	token := sign(t, jwt.SigningMethodRS256, "rsa-1", k.rsa, claimsAt(clock.now()))
	if _, err := a.Authenticate(request(token)); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("err = %v before the key was added", err)
	}
	writeFile(t, path, jwks(t, map[string]any{"ec-1": k.ec, "rsa-1": k.rsa}))
	clock.add(time.Second)
	if _, err := a.Authenticate(request(token)); err != nil {
		t.Fatalf("the key added to the file: %v", err)
	}
	writeFile(t, path, `{"keys": [`)
	clock.add(time.Second)
	if _, err := a.Authenticate(request(token)); err != nil {
		t.Fatalf("a broken file replaced the keys: %v", err)
	}
}

// idp is an identity provider's JWKS endpoint in a test.
type idp struct {
	mu      sync.Mutex
	body    string
	status  int
	fetches atomic.Int32
}

func (s *idp) set(status int, body string) {
	s.mu.Lock()
	s.status, s.body = status, body
	s.mu.Unlock()
}

func (s *idp) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	s.fetches.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	w.WriteHeader(s.status)
	_, _ = w.Write([]byte(s.body))
}

func TestAuthJWKSURL(t *testing.T) {
	k := newTestKeys(t)
	clock := newFakeClock()
	provider := &idp{}
	provider.set(http.StatusServiceUnavailable, "down")
	srv := httptest.NewServer(provider)
	t.Cleanup(srv.Close)
	log, logged := testLog()
	a, err := NewJWT(JWTConfig{JWKSURL: srv.URL + "/jwks", Issuer: testIssuer, Audience: testAudience, Log: log, Now: clock.now, HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	token := func(kid string) string {
		return sign(t, jwt.SigningMethodRS256, kid, k.rsa, claimsAt(clock.now()))
	}

	// The provider down: not the caller's fault (503), logged once a minute.
	for range 5 {
		clock.add(time.Second)
		_, err := a.Authenticate(request(token("rsa-1")))
		if err == nil || errors.Is(err, ErrUnauthenticated) || !errors.Is(err, ErrKeysUnavailable) {
			t.Fatalf("err = %v, want ErrKeysUnavailable and not ErrUnauthenticated", err)
		}
	}
	if n := strings.Count(logged.String(), "JWT key set not fetched"); n != 1 {
		t.Errorf("logged %d times in 5 seconds, want once:\n%s", n, logged)
	}
	// Without a token, it is still 401.
	if _, err := a.Authenticate(request("")); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("no token: err = %v", err)
	}

	// Up: fetched once, then served from the cache.
	provider.set(http.StatusOK, jwks(t, map[string]any{"rsa-1": k.rsa}))
	clock.add(time.Second)
	before := provider.fetches.Load()
	for range 3 {
		if _, err := a.Authenticate(request(token("rsa-1"))); err != nil {
			t.Fatal(err)
		}
	}
	if n := provider.fetches.Load() - before; n != 1 {
		t.Errorf("%d fetches for three requests, want 1", n)
	}

	// Rotation: a token of a new key fetches the set again.
	rotated, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	provider.set(http.StatusOK, jwks(t, map[string]any{"rsa-1": k.rsa, "rsa-2": rotated}))
	clock.add(DefaultUnknownKeyRefresh)
	if _, err := a.Authenticate(request(sign(t, jwt.SigningMethodRS256, "rsa-2", rotated, claimsAt(clock.now())))); err != nil {
		t.Fatalf("a token of the rotated-in key: %v", err)
	}
	// Tokens of made-up key IDs do not fetch more than once per
	// DefaultUnknownKeyRefresh.
	before = provider.fetches.Load()
	for i := range 5 {
		if _, err := a.Authenticate(request(token("made-up-" + string(rune('a'+i))))); !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("unknown kid: err = %v", err)
		}
	}
	if n := provider.fetches.Load() - before; n != 0 {
		t.Errorf("%d fetches for unknown kids within %s of the last fetch, want 0", n, DefaultUnknownKeyRefresh)
	}

	// The provider down again: the keys fetched before stay in use.
	provider.set(http.StatusInternalServerError, "")
	clock.add(DefaultRefreshInterval)
	if _, err := a.Authenticate(request(token("rsa-1"))); err != nil {
		t.Fatalf("a known key while the provider is down: %v", err)
	}
	// A key that may be in the set that could not be fetched: 503.
	clock.add(DefaultUnknownKeyRefresh)
	if _, err := a.Authenticate(request(token("rsa-3"))); !errors.Is(err, ErrKeysUnavailable) {
		t.Fatalf("an unknown kid while the provider is down: err = %v, want ErrKeysUnavailable", err)
	}
}

// Concurrent first requests fetch the key set once, and the race
// detector judges the sharing of the keys.
func TestAuthJWKSURLConcurrent(t *testing.T) {
	k := newTestKeys(t)
	clock := newFakeClock()
	provider := &idp{}
	provider.set(http.StatusOK, jwks(t, map[string]any{"ec-1": k.ec}))
	srv := httptest.NewServer(provider)
	t.Cleanup(srv.Close)
	log, _ := testLog()
	a, err := NewJWT(JWTConfig{JWKSURL: srv.URL, Issuer: testIssuer, Audience: testAudience, Log: log, Now: clock.now, HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	token := sign(t, jwt.SigningMethodES256, "ec-1", k.ec, claimsAt(clock.now()))
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 20 {
				if _, err := a.Authenticate(request(token)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := provider.fetches.Load(); n != 1 {
		t.Errorf("%d fetches for 320 requests, want 1", n)
	}
}

// A JWT that passed is remembered, but not past its exp, nor past the
// removal of its key.
func TestAuthJWTVerifiedTokens(t *testing.T) {
	k := newTestKeys(t)
	clock := newFakeClock()
	a, path := jwksFileAuth(t, clock, map[string]any{"rsa-1": k.rsa, "ec-1": k.ec})
	c := claimsAt(clock.now())
	c["exp"] = clock.now().Add(2 * time.Minute).Unix()
	token := sign(t, jwt.SigningMethodRS256, "rsa-1", k.rsa, c)
	for range 2 {
		if p, err := a.Authenticate(request(token)); err != nil || p.Subject != "svc-billing" {
			t.Fatalf("Authenticate = %+v, %v", p, err)
		}
	}
	// A caller changing its principal's scopes does not change the kept one.
	p, _ := a.Authenticate(request(token))
	p.Scopes[0] = ScopeAdmin
	if p, _ := a.Authenticate(request(token)); p.Allows(ScopeAdmin) {
		t.Fatal("the kept principal was changed through a returned one")
	}

	// Past exp and the leeway: refused though it passed before.
	clock.add(2*time.Minute + DefaultLeeway)
	if _, err := a.Authenticate(request(token)); !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("an expired token that passed before: err = %v", err)
	}

	// Its key removed from the set: refused at once.
	token = sign(t, jwt.SigningMethodRS256, "rsa-1", k.rsa, claimsAt(clock.now()))
	if _, err := a.Authenticate(request(token)); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, jwks(t, map[string]any{"ec-1": k.ec}))
	clock.add(time.Second)
	if _, err := a.Authenticate(request(token)); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("a token of a removed key that passed before: err = %v", err)
	}
}

// heldIdP is a JWKS endpoint whose answers wait until the test lets them go.
type heldIdP struct {
	body    string
	held    atomic.Bool   // fetches wait for release
	entered chan struct{} // a fetch has arrived
	release chan struct{} // closed: answer
}

func (s *heldIdP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.entered <- struct{}{}
	if s.held.Load() {
		select {
		case <-s.release:
		case <-r.Context().Done():
		}
	}
	_, _ = w.Write([]byte(s.body))
}

// A periodic refresh of the key set is made by one request; the others go
// on with the keys they have instead of waiting for a slow provider.
func TestAuthJWKSURLSlowRefresh(t *testing.T) {
	k := newTestKeys(t)
	clock := newFakeClock()
	provider := &heldIdP{body: jwks(t, map[string]any{"ec-1": k.ec}), entered: make(chan struct{}, 1), release: make(chan struct{})}
	srv := httptest.NewServer(provider)
	t.Cleanup(srv.Close)
	log, _ := testLog()
	a, err := NewJWT(JWTConfig{JWKSURL: srv.URL, Issuer: testIssuer, Audience: testAudience, Log: log, Now: clock.now, HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	token := func() string {
		clock.add(time.Second) // another iat and exp: another token, not a remembered one
		return sign(t, jwt.SigningMethodES256, "ec-1", k.ec, claimsAt(clock.now()))
	}
	if _, err := a.Authenticate(request(token())); err != nil {
		t.Fatal(err)
	}
	<-provider.entered

	provider.held.Store(true)
	clock.add(DefaultRefreshInterval)
	refreshed := make(chan error, 1)
	go func() {
		_, err := a.Authenticate(request(token()))
		refreshed <- err
	}()
	<-provider.entered // the refresh is under way, and held
	for range 3 {
		if _, err := a.Authenticate(request(token())); err != nil {
			t.Fatalf("a request during the refresh: %v", err)
		}
	}
	close(provider.release)
	if err := <-refreshed; err != nil {
		t.Fatalf("the refreshing request: %v", err)
	}
}

// A key of an identity provider's set that cannot be used is left out,
// not the set: the provider's other keys keep working.
func TestAuthJWKSURLWeakKeyLeftOut(t *testing.T) {
	k := newTestKeys(t)
	clock := newFakeClock()
	provider := &idp{}
	set := jwks(t, map[string]any{"ec-1": k.ec})
	if !strings.HasPrefix(set, `{"keys":[`) {
		t.Fatalf("the key set begins otherwise: %s", set)
	}
	provider.set(http.StatusOK, strings.Replace(set, `{"keys":[`, `{"keys":[{"kty":"oct","kid":"weak","k":"c2hvcnQ"},`, 1))
	srv := httptest.NewServer(provider)
	t.Cleanup(srv.Close)
	log, _ := testLog()
	a, err := NewJWT(JWTConfig{JWKSURL: srv.URL, Issuer: testIssuer, Audience: testAudience, Log: log, Now: clock.now, HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(request(sign(t, jwt.SigningMethodES256, "ec-1", k.ec, claimsAt(clock.now())))); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(request(sign(t, jwt.SigningMethodHS256, "weak", []byte("short"), claimsAt(clock.now())))); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("a token of the left-out key: err = %v", err)
	}
}
