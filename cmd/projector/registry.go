package main

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/redact"
)

// registryAuth are the registry's credentials given apart from
// --registry-url (--registry-user, --registry-password).
type registryAuth struct {
	registryUser, registryPassword string
}

// registryClient returns a Schema Registry client for --registry-url.
// Credentials come from --registry-user and --registry-password, or else
// from the URL's userinfo; either way they are handed to the client as
// basic auth and taken out of the URL it is given, because the client
// quotes that URL in its errors and those reach logs, dead letters and
// the terminal.
func (c *common) registryClient() (*sr.Client, error) {
	u, err := parseRegistryURL(c.registryURL)
	if err != nil {
		return nil, err
	}
	user, pass, auth := "", "", false
	if u.User != nil {
		user, auth = u.User.Username(), true
		pass, _ = u.User.Password()
		u.User = nil
	}
	switch {
	case c.registryUser != "":
		user, pass, auth = c.registryUser, c.registryPassword, true
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
	if auth {
		opts = append(opts, sr.BasicAuth(user, pass))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("--registry-url: %w", redact.Error(err))
	}
	return cl, nil
}
