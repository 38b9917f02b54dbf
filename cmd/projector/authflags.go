package main

import (
	"flag"
	"fmt"
	"log/slog"

	"github.com/projector-dev/projector/auth"
)

// The values of --auth.
const (
	authNone   = "none"
	authTokens = "tokens"
	authJWT    = "jwt"
)

// authFlags are the flags of the HTTP APIs' authentication. --auth has
// no value that lets every request in unless it is written out: its
// default, tokens, refuses to start without a token file, so a forgotten
// flag stops a deployment instead of opening it.
type authFlags struct {
	fs *flag.FlagSet

	mode        string
	tokenFile   string
	jwksFile    string
	jwksURL     string
	hmacKeyFile string
	issuer      string
	audience    string
	scopeClaim  string
	tenantClaim string
}

func (a *authFlags) register(fs *flag.FlagSet) {
	a.fs = fs
	fs.StringVar(&a.mode, "auth", authTokens, "how API requests are authenticated: tokens (bearer tokens of --auth-token-file), jwt (bearer JWTs checked against --auth-jwks-file, --auth-jwks-url or --auth-hmac-key-file) or none (every request may do everything: only behind another gatekeeper, and logged as a warning)")
	fs.StringVar(&a.tokenFile, "auth-token-file", "", "with --auth tokens: YAML or JSON file of the accepted tokens, SHA-256 hashed, each with a name, scopes and an optional tenant; read again within a second of a change (see docs/auth.md)")
	fs.StringVar(&a.jwksFile, "auth-jwks-file", "", "with --auth jwt: JSON Web Key Set file of the keys that sign the tokens; read again within a second of a change")
	fs.StringVar(&a.jwksURL, "auth-jwks-url", "", "with --auth jwt: JSON Web Key Set URL of the identity provider (its jwks_uri), fetched on first use, every 15 minutes and when a token names a key it does not hold (at most every 10 seconds)")
	fs.StringVar(&a.hmacKeyFile, "auth-hmac-key-file", "", "with --auth jwt: file holding the shared secret of HS256 tokens (at least 32 bytes; a trailing line ending is not part of it)")
	fs.StringVar(&a.issuer, "auth-issuer", "", "with --auth jwt: the iss claim every token must carry")
	fs.StringVar(&a.audience, "auth-audience", "", "with --auth jwt: a value the aud claim of every token must hold")
	fs.StringVar(&a.scopeClaim, "auth-scope-claim", "scope", "with --auth jwt: the claim of the scopes, a space-separated string or an array (scp is read when it is absent)")
	fs.StringVar(&a.tenantClaim, "auth-tenant-claim", "tenant", "with --auth jwt: the claim of the tenant a token is limited to; a token without it sees every tenant its scopes allow")
}

// authenticator returns the authenticator the flags describe, or an
// error naming the flag that is missing or does not fit --auth.
func (a *authFlags) authenticator(log *slog.Logger) (auth.Authenticator, error) {
	switch a.mode {
	case authNone, authTokens, authJWT:
	default:
		return nil, fmt.Errorf("--auth %q (%s): want %s, %s or %s", a.mode, envName("--auth"), authTokens, authJWT, authNone)
	}
	// A flag of another mode is refused: it says the deployment meant
	// something else than it gets.
	var wrong error
	a.fs.Visit(func(f *flag.Flag) {
		if mode, ok := authFlagMode[f.Name]; ok && mode != a.mode && wrong == nil {
			wrong = fmt.Errorf("--%s (%s) is for --auth %s, and --auth is %s", f.Name, envName("--"+f.Name), mode, a.mode)
		}
	})
	if wrong != nil {
		return nil, wrong
	}
	switch a.mode {
	case authNone:
		log.Warn("--auth none: no authentication: API requests are not authenticated, and every caller may read every projection and use the admin API")
		return auth.None{}, nil
	case authTokens:
		if a.tokenFile == "" {
			return nil, fmt.Errorf("--auth %s needs --auth-token-file (%s): the file of the accepted tokens; --auth jwt takes JWTs instead, and --auth none lets every request in", authTokens, envName("--auth-token-file"))
		}
		t, err := auth.NewTokenFile(a.tokenFile, log, nil)
		if err != nil {
			return nil, fmt.Errorf("--auth-token-file (%s): %w", envName("--auth-token-file"), err)
		}
		return t, nil
	case authJWT:
		j, err := auth.NewJWT(auth.JWTConfig{
			JWKSFile:    a.jwksFile,
			JWKSURL:     a.jwksURL,
			HMACKeyFile: a.hmacKeyFile,
			Issuer:      a.issuer,
			Audience:    a.audience,
			ScopeClaim:  a.scopeClaim,
			TenantClaim: a.tenantClaim,
			Log:         log,
		})
		if err != nil {
			return nil, fmt.Errorf("--auth jwt: %w", err)
		}
		return j, nil
	}
	panic("unreachable: --auth checked above")
}

// authFlagMode is the --auth value each --auth-* flag belongs to.
var authFlagMode = map[string]string{
	"auth-token-file":    authTokens,
	"auth-jwks-file":     authJWT,
	"auth-jwks-url":      authJWT,
	"auth-hmac-key-file": authJWT,
	"auth-issuer":        authJWT,
	"auth-audience":      authJWT,
	"auth-scope-claim":   authJWT,
	"auth-tenant-claim":  authJWT,
}
