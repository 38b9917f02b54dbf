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

// keywords masks the passwords of keyword/value pairs, and those of URLs
// written without a scheme.
func keywords(s string) string {
	s = bare(s)
	if !strings.Contains(strings.ToLower(s), "password") {
		return s
	}
	return keywordRe.ReplaceAllString(s, "${1}${2}"+Mask)
}

// bare masks the userinfo password of every URL written without a scheme,
// user:password@host[:port][/…], such as a flag's value whose http:// was
// forgotten: URL parsers take it for a scheme and an opaque part, so
// nothing that relies on parsing it finds the password. A word (text
// between white space, quotes, angle brackets and backquotes) is taken
// for one when it has a colon and, after it, an @ followed by something
// shaped like a host; the password runs from the first colon to the last
// such @, as a URL parser takes it. Prose rarely has such a word, and
// masking one that was not a password costs less than printing one that
// was; an e-mail address, which has no colon before its @, stays, and so
// do mailto: addresses and image digests (name:tag@sha256:…).
func bare(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	var b strings.Builder
	last := 0
	for i := 0; i < len(s); {
		if wordBreak(s[i]) {
			i++
			continue
		}
		j := i
		for j < len(s) && !wordBreak(s[j]) {
			j++
		}
		if m := bareWord(s[i:j]); m != s[i:j] {
			b.WriteString(s[last:i])
			b.WriteString(m)
			last = j
		}
		i = j
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// wordBreak reports whether c ends a word for bare: the characters urlRe
// stops a URL at.
func wordBreak(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', '\v', '\f', '"', '\'', '<', '>', '`':
		return true
	}
	return false
}

// bareWord masks w's password and credential parameters when w is a URL
// without a scheme (see bare), and returns it unchanged otherwise.
func bareWord(w string) string {
	colon := strings.IndexByte(w, ':')
	if colon < 0 || strings.HasPrefix(strings.ToLower(w), "mailto:") {
		return w
	}
	at := -1
	for k := len(w) - 1; k > colon; k-- {
		if w[k] == '@' && k+1 < len(w) && hostStart(w[k+1]) {
			at = k
			break
		}
	}
	if at < 0 || at == colon+1 {
		return w
	}
	host := strings.ToLower(w[at+1:])
	if strings.HasPrefix(host, "sha256:") || strings.HasPrefix(host, "sha512:") {
		return w
	}
	return w[:colon+1] + Mask + params(w[at:])
}

// hostStart reports whether c may begin a host name or address.
func hostStart(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '['
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
	if !strings.Contains(u, "://") {
		// user:password@host parses as scheme user and an opaque part.
		return params(bareWord(u))
	}
	return params(userinfoRe.ReplaceAllString(u, "${1}"+Mask+"@"))
}

// params masks the values of u's credential query parameters by pattern.
func params(u string) string {
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
