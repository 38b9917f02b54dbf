package auth

// JWTs are verified by github.com/golang-jwt/jwt/v5, the most used Go JWT
// library, small and without dependencies: it checks the signature, the
// algorithm against an allow-list, iss, aud, exp and nbf. Key sets are
// parsed by github.com/MicahParks/jwkset, the JWK Set library under
// github.com/MicahParks/keyfunc, golang-jwt's usual key-set companion.
// keyfunc itself is not used: its background refresher cannot tell a key
// set that could not be fetched (503: the caller should retry) from a
// token of an unknown key (401), and fetching on demand from the request
// that needs the keys leaves no goroutine to own. lestrrat-go/jwx/v3
// would do all of it, with far more code and dependencies (JWE, its own
// HTTP cache, key generation) than the API uses.

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"

	"github.com/projector-dev/projector/internal/redact"
)

// Defaults of JWTConfig.
const (
	// DefaultLeeway is the clock skew allowed on exp and nbf: a token
	// expired 30 seconds ago still passes, one valid in 30 seconds
	// already does.
	DefaultLeeway = 30 * time.Second
	// DefaultRefreshInterval is how old a fetched key set may grow before
	// the next request fetches it again.
	DefaultRefreshInterval = 15 * time.Minute
	// DefaultUnknownKeyRefresh is how often at most a token signed by a
	// key the set does not have fetches the set again: a rotated key is
	// found at once, and tokens of made-up key IDs do not turn the
	// service into a load on the identity provider.
	DefaultUnknownKeyRefresh = 10 * time.Second
	// maxJWKSBytes bounds a fetched key set.
	maxJWKSBytes = 1 << 20
)

// ErrKeysUnavailable is the error of a JWT that cannot be checked
// because the key set could not be fetched: the API answers 503.
var ErrKeysUnavailable = errors.New("JWT key set unavailable")

// allowedAlgs are the algorithms a JWT may be signed with. none is never
// one of them; each names the only key type that verifies it (keyFor).
var allowedAlgs = []string{"RS256", "ES256", "HS256"}

// JWTConfig configures a JWT authenticator (--auth jwt). Exactly one of
// JWKSFile, JWKSURL and HMACKeyFile gives the keys.
type JWTConfig struct {
	// JWKSFile is a JSON Web Key Set file, read again when it changes.
	JWKSFile string
	// JWKSURL is a JSON Web Key Set URL (an identity provider's jwks_uri).
	JWKSURL string
	// HMACKeyFile holds the shared secret of HS256 tokens: the file's
	// bytes but a trailing line ending, at least 32 of them.
	HMACKeyFile string
	// Issuer is the iss every token must have. Required.
	Issuer string
	// Audience is a value the token's aud must hold. Required.
	Audience string
	// ScopeClaim is the claim of the scopes: a space-separated string
	// (OAuth 2.0) or an array of strings. Default "scope"; scp is read
	// when the claim is absent.
	ScopeClaim string
	// TenantClaim is the claim of the tenant; empty: tokens carry none.
	TenantClaim string
	// Leeway is the clock skew allowed on exp and nbf. Default
	// DefaultLeeway.
	Leeway time.Duration
	// RefreshInterval and UnknownKeyRefresh pace the fetches of JWKSURL.
	// Defaults DefaultRefreshInterval and DefaultUnknownKeyRefresh.
	RefreshInterval, UnknownKeyRefresh time.Duration
	// HTTPClient fetches JWKSURL. Default: a client of a 10-second timeout.
	HTTPClient *http.Client
	// Log receives the failures to fetch or read keys, at most one a
	// minute. Required.
	Log *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// JWT authenticates bearer JWTs.
type JWT struct {
	cfg    JWTConfig
	parser *jwt.Parser
	file   *watchedFile // JWKSFile's
	logged rateLimit    // failures to fetch or read keys

	fetchMu  sync.Mutex // one fetch at a time
	verified verifiedTokens

	mu        sync.RWMutex
	keys      []verifyKey
	fetched   time.Time // when keys were last fetched from JWKSURL
	attempted time.Time // when JWKSURL was last fetched, successfully or not
	fetchErr  error     // the last fetch's failure, nil after a success
}

var _ Authenticator = (*JWT)(nil)

// verifyKey is a key of the set: its kid, the alg it is limited to if
// any, and the public key or HMAC secret.
type verifyKey struct {
	kid string
	alg string
	key any
}

// NewJWT checks cfg and reads the key file, if any. A JWKS URL is fetched
// by the first request that needs it.
func NewJWT(cfg JWTConfig) (*JWT, error) {
	n := 0
	for _, s := range []string{cfg.JWKSFile, cfg.JWKSURL, cfg.HMACKeyFile} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		return nil, errors.New("JWT authentication needs exactly one source of keys: --auth-jwks-file, --auth-jwks-url or --auth-hmac-key-file")
	}
	if cfg.Issuer == "" {
		return nil, errors.New("JWT authentication needs --auth-issuer: the iss of the tokens to accept")
	}
	if cfg.Audience == "" {
		return nil, errors.New("JWT authentication needs --auth-audience: the aud the tokens must be addressed to")
	}
	if cfg.JWKSURL != "" {
		u, err := url.Parse(cfg.JWKSURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return nil, fmt.Errorf("--auth-jwks-url %q: want an https:// URL such as https://idp.example.com/.well-known/jwks.json", cfg.JWKSURL)
		}
	}
	if cfg.ScopeClaim == "" {
		cfg.ScopeClaim = "scope"
	}
	if cfg.Leeway == 0 {
		cfg.Leeway = DefaultLeeway
	}
	if cfg.RefreshInterval == 0 {
		cfg.RefreshInterval = DefaultRefreshInterval
	}
	if cfg.UnknownKeyRefresh == 0 {
		cfg.UnknownKeyRefresh = DefaultUnknownKeyRefresh
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	j := &JWT{
		cfg: cfg,
		parser: jwt.NewParser(
			jwt.WithValidMethods(allowedAlgs),
			jwt.WithIssuer(cfg.Issuer),
			jwt.WithAudience(cfg.Audience),
			jwt.WithExpirationRequired(),
			jwt.WithLeeway(cfg.Leeway),
			jwt.WithTimeFunc(cfg.Now),
		),
		logged: rateLimit{every: time.Minute, now: cfg.Now},
	}
	switch {
	case cfg.HMACKeyFile != "":
		secret, err := os.ReadFile(cfg.HMACKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--auth-hmac-key-file: %w", err)
		}
		secret = bytes.TrimRight(secret, "\r\n") // the line ending echo or an editor adds is not part of the secret
		if len(secret) < 32 {
			return nil, fmt.Errorf("--auth-hmac-key-file %s: %d bytes: an HS256 key needs at least 32 (RFC 7518 §3.2)", cfg.HMACKeyFile, len(secret))
		}
		j.keys = []verifyKey{{alg: "HS256", key: secret}}
	case cfg.JWKSFile != "":
		j.file = &watchedFile{path: cfg.JWKSFile, now: cfg.Now}
		data, err := j.file.read()
		if err != nil {
			return nil, fmt.Errorf("--auth-jwks-file: %w", err)
		}
		if j.keys, err = parseJWKS(data, true); err != nil {
			return nil, fmt.Errorf("--auth-jwks-file %s: %w", cfg.JWKSFile, err)
		}
	}
	return j, nil
}

// parseJWKS returns the signature keys of a JWK Set. A key of another
// use, or of a type none of allowedAlgs verifies, is left out. A key that
// does not parse, or is too weak, fails a set of the operator's own
// (strict: a file), so that a mistake is not found at the first token it
// was meant for; in an identity provider's set it is left out, so that
// one key the provider adds cannot take the others away.
func parseJWKS(data []byte, strict bool) ([]verifyKey, error) {
	var set jwkset.JWKSMarshal
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("not a JWK Set: %w", err)
	}
	var (
		keys    []verifyKey
		skipped error
	)
	for i, m := range set.Keys {
		if m.USE != "" && m.USE != jwkset.UseSig {
			continue
		}
		k, ok, err := signatureKey(m)
		if err != nil {
			at := fmt.Sprintf("key %d", i+1)
			if m.KID != "" {
				at += fmt.Sprintf(" (kid %q)", m.KID)
			}
			if strict {
				return nil, fmt.Errorf("%s: %w", at, err)
			}
			skipped = fmt.Errorf("%s left out: %w", at, err)
			continue
		}
		if ok {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		if skipped != nil {
			return nil, fmt.Errorf("no RS256, ES256 or HS256 signature key: %w", skipped)
		}
		return nil, errors.New("no RS256, ES256 or HS256 signature key")
	}
	return keys, nil
}

// signatureKey returns the key of m, false when it is of a type no
// algorithm of allowedAlgs verifies, or why it cannot be used.
func signatureKey(m jwkset.JWKMarshal) (verifyKey, bool, error) {
	jwk, err := jwkset.NewJWKFromMarshal(m, jwkset.JWKMarshalOptions{Private: true}, jwkset.JWKValidateOptions{})
	if err != nil {
		return verifyKey{}, false, err
	}
	key := jwk.Key()
	if s, ok := key.(crypto.Signer); ok {
		key = s.Public() // a private key given by mistake verifies as its public key
	}
	switch k := key.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return verifyKey{}, false, fmt.Errorf("RSA key of %d bits: RS256 needs at least 2048", k.N.BitLen())
		}
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return verifyKey{}, false, nil // ES384 and ES512 keys: not accepted
		}
	case []byte:
		if len(k) < 32 {
			return verifyKey{}, false, fmt.Errorf("oct key of %d bytes: HS256 needs at least 32 (RFC 7518 §3.2)", len(k))
		}
	default:
		return verifyKey{}, false, nil
	}
	return verifyKey{kid: m.KID, alg: string(m.ALG), key: key}, true, nil
}

// keyMatches reports whether key verifies alg: its type is the one alg
// needs, so that an RSA public key, which anyone may know, is never taken
// for an HS256 secret.
func keyMatches(k verifyKey, alg string) bool {
	if k.alg != "" && k.alg != alg {
		return false
	}
	switch k.key.(type) {
	case *rsa.PublicKey:
		return alg == "RS256"
	case *ecdsa.PublicKey:
		return alg == "ES256"
	case []byte:
		return alg == "HS256"
	}
	return false
}

// Why no key verifies a token.
var (
	errUnknownKey = errors.New("unknown key")           // a kid the set does not hold
	errKeyType    = errors.New("key of the wrong type") // a kid of a key for another algorithm
)

// pick returns the keys of keys that may verify a token of alg and kid.
func pick(keys []verifyKey, alg, kid string) (jwt.VerificationKeySet, error) {
	var set jwt.VerificationKeySet
	for _, k := range keys {
		if kid != "" && k.kid != kid {
			continue
		}
		if !keyMatches(k, alg) {
			if kid != "" {
				return set, fmt.Errorf("%w: key %q is not a key for %s", errKeyType, kid, alg)
			}
			continue
		}
		set.Keys = append(set.Keys, k.key)
	}
	if len(set.Keys) == 0 {
		if kid != "" {
			return set, fmt.Errorf("%w %q", errUnknownKey, kid)
		}
		return set, fmt.Errorf("no key for %s", alg)
	}
	return set, nil
}

// keyFunc finds the keys that may verify t.
func (j *JWT) keyFunc(ctx context.Context) jwt.Keyfunc {
	return func(t *jwt.Token) (any, error) {
		alg := t.Method.Alg()
		kid, _ := t.Header["kid"].(string)
		keys, err := j.currentKeys(ctx, false)
		if err != nil {
			return nil, err
		}
		set, err := pick(keys, alg, kid)
		if errors.Is(err, errUnknownKey) && j.cfg.JWKSURL != "" {
			// A key rotated in since the last fetch.
			if keys, err = j.currentKeys(ctx, true); err != nil {
				return nil, err
			}
			set, err = pick(keys, alg, kid)
		}
		return set, err
	}
}

// currentKeys returns the key set, fetching JWKSURL when it has never
// been fetched, has grown older than RefreshInterval, or, when unknown is
// set, a token named a key it does not hold and UnknownKeyRefresh has
// passed since the last fetch. A set fetched before stays in use when a
// fetch fails; with none, the error wraps ErrKeysUnavailable.
func (j *JWT) currentKeys(ctx context.Context, unknown bool) ([]verifyKey, error) {
	if j.cfg.JWKSURL == "" {
		j.mu.RLock()
		defer j.mu.RUnlock()
		return j.keys, nil
	}
	due := func() bool {
		now := j.cfg.Now()
		switch {
		case j.keys == nil:
			return now.Sub(j.attempted) >= time.Second || j.attempted.IsZero()
		case unknown:
			return now.Sub(j.attempted) >= j.cfg.UnknownKeyRefresh
		default:
			return now.Sub(j.fetched) >= j.cfg.RefreshInterval && now.Sub(j.attempted) >= j.cfg.UnknownKeyRefresh
		}
	}
	j.mu.RLock()
	fetch, waited := due(), j.keys == nil || unknown
	j.mu.RUnlock()
	switch {
	case !fetch:
	case waited:
		// Without the keys the token may need, wait for the fetch
		// another request may be making.
		j.fetchMu.Lock()
		j.mu.RLock()
		fetch = due() // another request may have fetched meanwhile
		j.mu.RUnlock()
		if fetch {
			j.fetch(ctx)
		}
		j.fetchMu.Unlock()
	case j.fetchMu.TryLock():
		// A periodic refresh: made by one request, while the others go
		// on with the keys they have.
		j.mu.RLock()
		fetch = due()
		j.mu.RUnlock()
		if fetch {
			j.fetch(ctx)
		}
		j.fetchMu.Unlock()
	}
	j.mu.RLock()
	defer j.mu.RUnlock()
	if j.keys == nil || unknown && j.fetchErr != nil {
		// A token of an unknown key may be signed by one of the set that
		// could not be fetched: the caller should try again, not be
		// turned away.
		return nil, fmt.Errorf("%w: %v", ErrKeysUnavailable, j.fetchErr)
	}
	return j.keys, nil
}

// fetch fetches JWKSURL and records the outcome.
func (j *JWT) fetch(ctx context.Context) {
	keys, err := j.get(ctx)
	j.mu.Lock()
	defer j.mu.Unlock()
	now := j.cfg.Now()
	j.attempted = now
	j.fetchErr = err
	if err != nil {
		if j.logged.allow() {
			j.cfg.Log.Error("JWT key set not fetched: tokens of keys not fetched before are answered 503 (logged at most once a minute)", "url", redact.URL(j.cfg.JWKSURL), "err", redact.Error(err))
		}
		return
	}
	j.keys, j.fetched = keys, now
	j.verified.clear() // a key removed from the set ends its tokens now
}

// get fetches and parses JWKSURL.
func (j *JWT) get(ctx context.Context) ([]verifyKey, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second) // one caller going away must not fail the fetch for the others
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.cfg.JWKSURL, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := j.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", j.cfg.JWKSURL, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", j.cfg.JWKSURL, err)
	}
	keys, err := parseJWKS(data, false)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", j.cfg.JWKSURL, err)
	}
	return keys, nil
}

// rereadFile reads JWKSFile again; a file that does not parse is logged
// and the keys read before stay.
func (j *JWT) rereadFile() {
	data, err := j.file.read()
	if err == nil {
		var keys []verifyKey
		if keys, err = parseJWKS(data, true); err == nil {
			j.mu.Lock()
			j.keys = keys
			j.verified.clear()
			j.mu.Unlock()
			j.cfg.Log.Info("JWT key set file read again", "file", j.file.path, "keys", len(keys))
			return
		}
	}
	j.cfg.Log.Error("JWT key set file changed and was not read: the keys read before stay in use", "file", j.file.path, "err", err)
}

// Authenticate returns the principal of r's bearer JWT: sub is the
// subject, the scope claim the scopes, the tenant claim the tenant.
func (j *JWT) Authenticate(r *http.Request) (Principal, error) {
	raw, err := bearerToken(r)
	if err != nil {
		return Principal{}, err
	}
	if j.file != nil && j.file.changed() {
		j.rereadFile()
	}
	sum := sha256.Sum256([]byte(raw))
	now := j.cfg.Now()
	if p, ok := j.verified.get(sum, now); ok {
		return p, nil
	}
	claims := jwt.MapClaims{}
	if _, err := j.parser.ParseWithClaims(raw, claims, j.keyFunc(r.Context())); err != nil {
		if errors.Is(err, ErrKeysUnavailable) {
			return Principal{}, fmt.Errorf("check JWT: %w", err)
		}
		return Principal{}, fmt.Errorf("%w: %s", ErrUnauthenticated, jwtReason(err))
	}
	sub, _ := claims["sub"].(string)
	if sub == "" {
		return Principal{}, fmt.Errorf("%w: the token has no sub claim", ErrUnauthenticated)
	}
	scopes, err := scopesOf(claims, j.cfg.ScopeClaim)
	if err != nil {
		return Principal{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	p := Principal{Subject: sub, Scopes: scopes}
	if j.cfg.TenantClaim != "" {
		switch v := claims[j.cfg.TenantClaim].(type) {
		case nil:
		case string:
			p.Tenant = v
		default:
			return Principal{}, fmt.Errorf("%w: the %s claim is not a string", ErrUnauthenticated, j.cfg.TenantClaim)
		}
	}
	if exp, err := claims.GetExpirationTime(); err == nil && exp != nil {
		j.verified.put(sum, p, exp.Add(j.cfg.Leeway), now)
	}
	return p, nil
}

// scopesOf reads the scopes of claims: claim as a space-separated string
// (OAuth 2.0, RFC 8693 §4.2) or an array of strings, or, when claim is
// absent, scp as either. Scopes other than projector's are left out: a
// token of an identity provider carries those of other services too.
func scopesOf(claims jwt.MapClaims, claim string) ([]string, error) {
	v, ok := claims[claim]
	if !ok {
		claim = "scp"
		v = claims[claim]
	}
	var all []string
	switch v := v.(type) {
	case nil:
	case string:
		all = strings.Fields(v)
	case []any:
		for _, s := range v {
			s, ok := s.(string)
			if !ok {
				return nil, fmt.Errorf("the %s claim holds a value that is not a string", claim)
			}
			all = append(all, s)
		}
	default:
		return nil, fmt.Errorf("the %s claim is neither a string nor an array of strings", claim)
	}
	scopes := []string{}
	for _, s := range all {
		if checkScope(s) == nil {
			scopes = append(scopes, s)
		}
	}
	return scopes, nil
}

// jwtReason is what a client may be told of why its token was refused:
// no part of the token, nor of the keys.
func jwtReason(err error) string {
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "malformed token"
	case errors.Is(err, jwt.ErrTokenExpired):
		return "token expired"
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return "token not valid yet"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "token of another issuer"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return "token for another audience"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return "token without an exp claim"
	case errors.Is(err, errKeyType):
		return "the key the token names is not of the type its algorithm needs"
	case errors.Is(err, errUnknownKey):
		return "token signed by an unknown key"
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return "no key verifies a token of this algorithm (RS256, ES256 and HS256 are accepted, each with its own key type)"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "signature not valid, or algorithm not accepted (RS256, ES256 and HS256 are)"
	}
	return "token not valid"
}

// rateLimit lets one event through per every.
type rateLimit struct {
	every time.Duration
	now   func() time.Time

	mu   sync.Mutex
	last time.Time
}

// allow reports whether an event may be logged now.
func (l *rateLimit) allow() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		return false
	}
	l.last = now
	return true
}

// A JWT that passed is remembered, by its SHA-256, for as long as it is
// valid and at most verifiedFor: checking an RS256 signature costs tens
// of microseconds, more than the read the token is for, and a caller
// presents the same token for every request until it expires. The set is
// emptied whenever the keys change, so a key removed from the set ends
// its tokens at once; at most maxVerified tokens are kept.
const (
	verifiedFor = time.Minute
	maxVerified = 10000
)

// verifiedTokens are the JWTs that passed, by hash.
type verifiedTokens struct {
	mu     sync.Mutex
	tokens map[[sha256.Size]byte]verifiedToken
}

type verifiedToken struct {
	p     Principal
	until time.Time
}

// get returns the principal of the token of hash sum if it passed and is
// still valid at now.
func (v *verifiedTokens) get(sum [sha256.Size]byte, now time.Time) (Principal, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.tokens[sum]
	if !ok {
		return Principal{}, false
	}
	if !now.Before(t.until) {
		delete(v.tokens, sum)
		return Principal{}, false
	}
	p := t.p
	p.Scopes = slices.Clone(p.Scopes) // callers may not change the kept one
	return p, true
}

// put keeps p for the token of hash sum until expires, or verifiedFor
// after now if that is sooner.
func (v *verifiedTokens) put(sum [sha256.Size]byte, p Principal, expires, now time.Time) {
	until := now.Add(verifiedFor)
	if expires.Before(until) {
		until = expires
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.tokens == nil || len(v.tokens) >= maxVerified {
		// Emptied rather than evicted one by one: refilling costs one
		// check per caller, and the set's size stays bounded whatever
		// tokens are presented.
		v.tokens = make(map[[sha256.Size]byte]verifiedToken)
	}
	v.tokens[sum] = verifiedToken{p: p, until: until}
}

// clear forgets every token.
func (v *verifiedTokens) clear() {
	v.mu.Lock()
	v.tokens = nil
	v.mu.Unlock()
}
