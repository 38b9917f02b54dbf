package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/projector-dev/projector/internal/redact"
)

// keywordDSN is the start of a Postgres keyword/value connection string
// (host=… dbname=…), which --database-url takes as well as a URL.
var keywordDSN = regexp.MustCompile(`^\s*[A-Za-z_]+\s*=`)

// checkURLFlags refuses, before a command does anything, a URL flag whose
// value has no scheme (user:password@host, its http:// forgotten):
// clients would take "user" for the scheme, fail later with a message
// that says little, and quote the password on the way. Errors mask the
// password (see redact).
func checkURLFlags(fs *flag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil {
			return
		}
		switch v := f.Value.String(); f.Name {
		case "registry-url":
			if v != "" {
				_, err = parseRegistryURL(v)
			}
		case "database-url":
			if v != "" && !strings.Contains(v, "://") && !keywordDSN.MatchString(v) {
				err = fmt.Errorf("--database-url %s: want a URL such as postgres://user@host:5432/db, and it has no scheme, or a keyword/value string such as host=… dbname=…", redact.String(v))
			}
		}
	})
	return err
}

// parseRegistryURL parses a --registry-url, which must be an http:// or
// https:// URL with a host.
func parseRegistryURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		return nil, fmt.Errorf("--registry-url %s: want an http:// or https:// URL such as http://host:8081, and it has no scheme (credentials go after the scheme, or in --registry-user and --registry-password)", redact.String(s))
	}
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the rest quotes the URL in clear
		}
		return nil, fmt.Errorf("--registry-url %s: %w", redact.String(s), redact.Error(err))
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("--registry-url %s: want an http:// or https:// URL with a host", redact.String(s))
	}
	return u, nil
}
