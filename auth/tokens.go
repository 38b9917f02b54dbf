package auth

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
)

// Tokens stored in a token file are SHA-256 hashes. A slow password hash
// (bcrypt, argon2) protects low-entropy secrets that can be guessed; the
// tokens here are 256 random bits, which no guess reaches whatever the
// hash, and a slow hash would cost tens of milliseconds of CPU on every
// request. A plain SHA-256 of a random token is as hard to invert as the
// token is to guess, and it can be looked up.
//
// The lookup is by hash, in a map. Its timing depends on the hash of the
// presented token, not on how many of its characters match a stored
// token, so it tells an attacker nothing: steering a hash towards a
// stored one would take a SHA-256 preimage. That is why a map lookup on
// the hash is as good as a constant-time comparison of every entry.

// hashPrefix begins every hash in a token file, naming the function so
// that another can be added without ambiguity.
const hashPrefix = "sha256:"

// HashToken returns the line a token file stores for token:
// sha256:<64 hex digits>.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hashPrefix + hex.EncodeToString(sum[:])
}

// NewToken returns a new random token: 32 bytes from the system's
// cryptographic source, base64url without padding (43 characters).
func NewToken() (string, error) {
	b := make([]byte, 32)
	if _, err := io.ReadFull(rand.Reader, b); err != nil {
		return "", fmt.Errorf("read random bytes for a token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// tokenEntry is one token of a token file.
type tokenEntry struct {
	Name   string   `yaml:"name"`
	Hash   string   `yaml:"hash"`
	Scopes []string `yaml:"scopes"`
	Tenant string   `yaml:"tenant"`
}

// tokenFile is a token file: YAML, or JSON, which YAML reads too.
type tokenFile struct {
	Tokens []tokenEntry `yaml:"tokens"`
}

var (
	hashRe       = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	projectionRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
)

// checkScope returns why scope is not one a principal may hold, or nil.
func checkScope(scope string) error {
	switch {
	case scope == ScopeAdmin, scope == ScopeReadAll:
		return nil
	case strings.HasPrefix(scope, "read:"):
		if name := strings.TrimPrefix(scope, "read:"); !projectionRe.MatchString(name) {
			return fmt.Errorf("scope %q: %q is not a projection name (lower-case letters, digits and _, starting with a letter or _)", scope, name)
		}
		return nil
	default:
		return fmt.Errorf("unknown scope %q: want read:<projection>, read:* or admin", scope)
	}
}

// parseTokenFile parses a token file's content into the principals by
// token hash. Errors name the file, the entry (its position from 1 and
// its name) and the field.
func parseTokenFile(path string, data []byte) (map[[sha256.Size]byte]Principal, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f tokenFile
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	if len(f.Tokens) == 0 {
		return nil, fmt.Errorf("token file %s: no tokens: want a list under tokens:, each with a name, a hash and scopes", path)
	}
	byHash := make(map[[sha256.Size]byte]Principal, len(f.Tokens))
	hashAt := map[[sha256.Size]byte]string{}
	nameAt := map[string]string{}
	for i, t := range f.Tokens {
		at := fmt.Sprintf("token file %s: token %d", path, i+1)
		if t.Name != "" {
			at += fmt.Sprintf(" (%s)", t.Name)
		}
		if t.Name == "" {
			return nil, fmt.Errorf("%s: name: missing: the name is the subject the audit records", at)
		}
		if prev, ok := nameAt[t.Name]; ok {
			return nil, fmt.Errorf("%s: name: already given to %s: two tokens of one name could not be told apart in the audit", at, prev)
		}
		nameAt[t.Name] = fmt.Sprintf("token %d", i+1)
		if t.Hash == "" {
			return nil, fmt.Errorf("%s: hash: missing: want sha256:<64 hex digits>, as printed by projector auth hash-token", at)
		}
		if !hashRe.MatchString(t.Hash) {
			if !strings.HasPrefix(t.Hash, hashPrefix) {
				// Do not quote it: it may be a token in the clear.
				return nil, fmt.Errorf("%s: hash: not a hash (it may be a token in the clear, which a token file must never hold): want sha256:<64 hex digits>, as printed by projector auth hash-token", at)
			}
			return nil, fmt.Errorf("%s: hash: want sha256: and 64 lower-case hex digits", at)
		}
		var sum [sha256.Size]byte
		if _, err := hex.Decode(sum[:], []byte(strings.TrimPrefix(t.Hash, hashPrefix))); err != nil {
			return nil, fmt.Errorf("%s: hash: %w", at, err)
		}
		if prev, ok := hashAt[sum]; ok {
			return nil, fmt.Errorf("%s: hash: the same as %s's: one token would stand for two names", at, prev)
		}
		hashAt[sum] = fmt.Sprintf("token %d (%s)", i+1, t.Name)
		if len(t.Scopes) == 0 {
			return nil, fmt.Errorf("%s: scopes: missing: want read:<projection>, read:* or admin", at)
		}
		for _, s := range t.Scopes {
			if err := checkScope(s); err != nil {
				return nil, fmt.Errorf("%s: scopes: %w", at, err)
			}
		}
		byHash[sum] = Principal{Subject: t.Name, Scopes: t.Scopes, Tenant: t.Tenant}
	}
	return byHash, nil
}

// TokenFile authenticates the bearer tokens listed, hashed, in a file
// (--auth tokens). It reads the file again when it changes; a change
// that does not parse is logged once and the tokens read before stay.
type TokenFile struct {
	file *watchedFile
	log  *slog.Logger

	mu     sync.RWMutex
	tokens map[[sha256.Size]byte]Principal
}

var _ Authenticator = (*TokenFile)(nil)

// NewTokenFile reads the token file at path. now is the clock the file
// checks go by; nil is time.Now.
func NewTokenFile(path string, log *slog.Logger, now func() time.Time) (*TokenFile, error) {
	if now == nil {
		now = time.Now
	}
	t := &TokenFile{file: &watchedFile{path: path, now: now}, log: log}
	data, err := t.file.read()
	if err != nil {
		return nil, fmt.Errorf("read token file: %w", err)
	}
	if t.tokens, err = parseTokenFile(path, data); err != nil {
		return nil, err
	}
	return t, nil
}

// reload reads the file again if it has changed.
func (t *TokenFile) reload() {
	if !t.file.changed() {
		return
	}
	data, err := t.file.read()
	if err != nil {
		t.log.Error("token file not read again: the tokens read before stay in use", "err", err)
		return
	}
	tokens, err := parseTokenFile(t.file.path, data)
	if err != nil {
		t.log.Error("token file changed and does not parse: the tokens read before stay in use", "err", err)
		return
	}
	t.mu.Lock()
	t.tokens = tokens
	t.mu.Unlock()
	t.log.Info("token file read again", "file", t.file.path, "tokens", len(tokens))
}

// Authenticate returns the principal of r's bearer token.
func (t *TokenFile) Authenticate(r *http.Request) (Principal, error) {
	token, err := bearerToken(r)
	if err != nil {
		return Principal{}, err
	}
	t.reload()
	sum := sha256.Sum256([]byte(token))
	t.mu.RLock()
	p, ok := t.tokens[sum]
	t.mu.RUnlock()
	if !ok {
		return Principal{}, fmt.Errorf("%w: unknown token", ErrUnauthenticated)
	}
	p.Scopes = append([]string(nil), p.Scopes...) // callers may not change the stored set
	return p, nil
}
