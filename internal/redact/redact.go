package redact

import (
	"log/slog"
	"net/url"
	"regexp"
	"strings"
)

// Mask replaces every secret.
const Mask = "xxxxx"

// secretParams are the query parameters whose values are credentials,
// compared in lower case.
var secretParams = map[string]bool{
	"password": true, "passwd": true, "pwd": true, "pass": true,
	"sslpassword": true, "sslkey_password": true,
	"token": true, "access_token": true, "refresh_token": true, "id_token": true,
	"api_key": true, "apikey": true, "api-key": true, "x-api-key": true,
	"secret": true, "client_secret": true,
	"auth": true, "authorization": true, "credentials": true,
	"sig": true, "signature": true,
}

var (
	// urlRe finds URLs inside text, up to a character that cannot be part
	// of one in a message: white space, quotes, angle brackets.
	urlRe = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.\-]*://[^\s"'<>` + "`" + `]+`)
	// userinfoRe is the password of a URL's userinfo, for URLs that do
	// not parse.
	userinfoRe = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.\-]*://[^:@/?#]*:)[^@]*@`)
	// paramRe is one query parameter, for URLs that do not parse.
	paramRe = regexp.MustCompile(`([?&;])([^=&;#]+)=([^&;#]*)`)
	// keywordRe is a password in a keyword/value connection string: a
	// single-quoted value (with backslash escapes) or one up to white
	// space.
	keywordRe = regexp.MustCompile(`(?i)\b(password|sslpassword)(\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s'"` + "`" + `]*)`)
)

// String returns s with every secret it holds masked: s may be a URL, a
// keyword/value connection string, or any text quoting them, such as an
// error message.
func String(s string) string {
	if s == "" {
		return s
	}
	var b strings.Builder
	last := 0
	for _, m := range urlRe.FindAllStringIndex(s, -1) {
		b.WriteString(keywords(s[last:m[0]]))
		b.WriteString(URL(s[m[0]:m[1]]))
		last = m[1]
	}
	b.WriteString(keywords(s[last:]))
	return b.String()
}

// keywords masks the passwords of keyword/value pairs.
func keywords(s string) string {
	if !strings.Contains(strings.ToLower(s), "password") {
		return s
	}
	return keywordRe.ReplaceAllString(s, "${1}${2}"+Mask)
}

// URL returns the URL u with its userinfo password and the values of its
// credential query parameters masked. Text that does not parse as a URL
// is masked by pattern.
func URL(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Opaque != "" {
		return patternURL(u)
	}
	changed := false
	if p.User != nil {
		if _, has := p.User.Password(); has {
			p.User = url.UserPassword(p.User.Username(), Mask)
			changed = true
		}
	}
	if p.RawQuery != "" {
		q, err := url.ParseQuery(p.RawQuery)
		if err != nil {
			return patternURL(u)
		}
		for k, vs := range q {
			if secretParams[strings.ToLower(k)] {
				for i := range vs {
					vs[i] = Mask
				}
				changed = true
			}
		}
		if changed {
			p.RawQuery = q.Encode()
		}
	}
	if !changed {
		return u
	}
	return p.String()
}

// patternURL masks what it can recognise in a URL that does not parse.
func patternURL(u string) string {
	u = userinfoRe.ReplaceAllString(u, "${1}"+Mask+"@")
	return paramRe.ReplaceAllStringFunc(u, func(m string) string {
		sub := paramRe.FindStringSubmatch(m)
		name, _ := url.QueryUnescape(sub[2])
		if !secretParams[strings.ToLower(name)] {
			return m
		}
		return sub[1] + sub[2] + "=" + Mask
	})
}

// Error returns err with its message masked, or nil for nil. errors.Is
// and errors.As still see err's chain.
func Error(err error) error {
	if err == nil {
		return nil
	}
	if r, ok := err.(*redacted); ok {
		return r
	}
	return &redacted{msg: String(err.Error()), err: err}
}

type redacted struct {
	msg string
	err error
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }

// ReplaceAttr masks secrets in a log record's strings and errors, and
// bounds each to MaxLogged bytes (see ClipTo); it is meant for
// slog.HandlerOptions.ReplaceAttr, so that a URL or a failure quoting one
// is never logged in clear, and a failure quoting a record's data never
// logs all of it, whoever logs it.
func ReplaceAttr(_ []string, a slog.Attr) slog.Attr {
	switch v := a.Value; v.Kind() {
	case slog.KindString:
		if s := v.String(); s != "" {
			if r := ClipTo(String(s), MaxLogged); r != s {
				a.Value = slog.StringValue(r)
			}
		}
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			a.Value = slog.StringValue(ClipTo(String(x.Error()), MaxLogged))
		case []string:
			out := make([]string, len(x))
			for i, s := range x {
				out[i] = String(s)
			}
			a.Value = slog.AnyValue(out)
		}
	}
	return a
}
