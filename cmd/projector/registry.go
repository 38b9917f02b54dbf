package main

import (
	"errors"
	"flag"
	"fmt"
	"net/http"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/redact"
)

// registryAuth are the registry's credentials given apart from
// --registry-url: basic auth (--registry-user with --registry-password or
// --registry-password-file) or a bearer token (--registry-bearer-token or
// --registry-bearer-token-file).
type registryAuth struct {
	registryUser, registryPassword, registryPasswordFile string
	registryToken, registryTokenFile                     string
}

func (r *registryAuth) register(fs *flag.FlagSet) {
	fs.StringVar(&r.registryUser, "registry-user", "", "Schema Registry basic-auth user, instead of user:password@ in --registry-url")
	fs.StringVar(&r.registryPassword, "registry-password", "", "Schema Registry basic-auth password; prefer the environment variable, a flag shows in ps, or --registry-password-file")
	fs.StringVar(&r.registryPasswordFile, "registry-password-file", "", "file holding the Schema Registry basic-auth password (a mounted Kubernetes secret, say), instead of --registry-password; read at each request, so a rotated password is used at once")
	fs.StringVar(&r.registryToken, "registry-bearer-token", "", "Schema Registry bearer token (Authorization: Bearer), instead of basic auth; prefer the environment variable or --registry-bearer-token-file")
	fs.StringVar(&r.registryTokenFile, "registry-bearer-token-file", "", "file holding the Schema Registry bearer token, instead of --registry-bearer-token; read at each request, so a token renewed in place is used at once")
}

// registryClient returns a Schema Registry client for --registry-url.
// Credentials come from the flags of registryAuth, or else from the URL's
// userinfo; either way they are handed to the client with each request
// and taken out of the URL it is given, because the client quotes that
// URL in its errors and those reach logs, dead letters and the terminal.
// The files of the secrets are read at every request: the registry is
// asked rarely (each schema once), and a rotated secret then works at
// once.
func (c *common) registryClient() (*sr.Client, error) {
	u, err := parseRegistryURL(c.registryURL)
	if err != nil {
		return nil, err
	}
	user, pass, auth, urlPass := "", "", false, false
	if u.User != nil {
		user, auth = u.User.Username(), true
		pass, urlPass = u.User.Password()
		u.User = nil
	}
	if urlPass && c.registryPasswordFile != "" {
		return nil, errors.New("both a password in --registry-url and --registry-password-file (PROJECTOR_REGISTRY_PASSWORD_FILE) are given: give one")
	}
	passFile, err := oneSecret("--registry-password", c.registryPassword, "--registry-password-file", c.registryPasswordFile)
	if err != nil {
		return nil, err
	}
	tokenFile, err := oneSecret("--registry-bearer-token", c.registryToken, "--registry-bearer-token-file", c.registryTokenFile)
	if err != nil {
		return nil, err
	}
	bearer := c.registryToken != "" || tokenFile != nil
	switch {
	case bearer && (auth || c.registryUser != "" || c.registryPassword != "" || passFile != nil):
		return nil, errors.New("--registry-bearer-token(-file) and basic auth (--registry-user, --registry-password(-file), user:password@ in --registry-url) are both given: the registry takes one")
	case c.registryUser != "":
		user, pass, auth = c.registryUser, c.registryPassword, true
	case passFile != nil && !auth:
		return nil, errors.New("--registry-password-file (PROJECTOR_REGISTRY_PASSWORD_FILE) needs --registry-user (PROJECTOR_REGISTRY_USER)")
	case c.registryPassword != "" && !auth:
		return nil, errors.New("--registry-password (PROJECTOR_REGISTRY_PASSWORD) needs --registry-user (PROJECTOR_REGISTRY_USER)")
	case c.registryPassword != "":
		pass = c.registryPassword
	}
	opts := []sr.ClientOpt{sr.URLs(u.String())}
	httpcl, err := c.registryHTTPClient()
	if err != nil {
		return nil, err
	}
	if httpcl != nil {
		opts = append(opts, sr.HTTPClient(httpcl))
	}
	switch {
	case tokenFile != nil:
		opts = append(opts, sr.PreReq(func(req *http.Request) error {
			token, err := tokenFile.read()
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+token)
			return nil
		}))
	case bearer:
		opts = append(opts, sr.BearerToken(c.registryToken))
	case auth && passFile != nil:
		opts = append(opts, sr.PreReq(func(req *http.Request) error {
			pass, err := passFile.read()
			if err != nil {
				return err
			}
			req.SetBasicAuth(user, pass)
			return nil
		}))
	case auth:
		opts = append(opts, sr.BasicAuth(user, pass))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("--registry-url: %w", redact.Error(err))
	}
	return cl, nil
}
