// Package auth authenticates the callers of projector's HTTP APIs: who
// they are (the subject the audit records), what they may do (scopes) and
// which tenant's rows they may see.
package auth

import (
	"errors"
	"net/http"
	"slices"
	"strings"
)

// Scopes a principal may hold.
const (
	// ScopeAdmin allows the admin API: dead letters, rebuilds, offsets.
	ScopeAdmin = "admin"
	// ScopeReadAll allows reading every projection.
	ScopeReadAll = "read:*"
)

// ReadScope is the scope that allows reading projection name.
func ReadScope(name string) string { return "read:" + name }

// ErrUnauthenticated is the error of a request whose credentials are
// missing or not valid: the API answers 401.
var ErrUnauthenticated = errors.New("unauthenticated")

// Principal is an authenticated caller.
type Principal struct {
	// Subject names the caller in the audit trail: a token's name, a
	// JWT's sub.
	Subject string
	// Scopes are what the caller may do.
	Scopes []string
	// Tenant, when not empty, limits the caller to the rows of that
	// tenant in projections that declare a tenant column.
	Tenant string
}

// Allows reports whether p holds scope, read:* standing for every
// read:<projection>.
func (p Principal) Allows(scope string) bool {
	if slices.Contains(p.Scopes, scope) {
		return true
	}
	return strings.HasPrefix(scope, "read:") && slices.Contains(p.Scopes, ScopeReadAll)
}

// Authenticator finds the principal of a request. An error wrapping
// ErrUnauthenticated means the credentials are missing or not valid;
// any other error is the authenticator's own failure (a JWKS that could
// not be fetched, say).
type Authenticator interface {
	Authenticate(r *http.Request) (Principal, error)
}

// None is the authenticator of --auth none: every request is the
// anonymous principal with every scope and no tenant.
type None struct{}

// Authenticate returns the anonymous principal.
func (None) Authenticate(*http.Request) (Principal, error) {
	return Principal{Subject: "anonymous", Scopes: []string{ScopeAdmin, ScopeReadAll}}, nil
}
