package redact_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/redact"
)

func TestString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://app:s3cret@db:5432/app?sslmode=disable", "postgres://app:xxxxx@db:5432/app?sslmode=disable"},
		{"postgres://app@db/app?password=s3cret&sslmode=disable", "postgres://app@db/app?password=xxxxx&sslmode=disable"},
		{"postgres://db/app?sslpassword=s3cret", "postgres://db/app?sslpassword=xxxxx"},
		{"https://sr.example/?api_key=s3cret&x=1", "https://sr.example/?api_key=xxxxx&x=1"},
		{"https://sr.example/path?Token=s3cret", "https://sr.example/path?Token=xxxxx"},
		{"host=db user=app password=s3cret dbname=app", "host=db user=app password=xxxxx dbname=app"},
		{"host=db password='s3 cret' dbname=app", "host=db password=xxxxx dbname=app"},
		{`host=db password='it\'s s3cret' dbname=app`, "host=db password=xxxxx dbname=app"},
		{"host=db sslpassword = s3cret", "host=db sslpassword = xxxxx"},
		{`unable to GET "http://u:s3cret@sr:8081/schemas/ids/1": dial tcp: refused`, `unable to GET "http://u:xxxxx@sr:8081/schemas/ids/1": dial tcp: refused`},
		// Does not parse as a URL (a bad escape): masked by pattern.
		{"http://u:s3cret@sr:8081/%zz?token=s3cret", "http://u:xxxxx@sr:8081/%zz?token=xxxxx"},
		{"cannot parse `postgres://u:s3cret@h/%zz`: bad", "cannot parse `postgres://u:xxxxx@h/%zz`: bad"},
		// Nothing secret: unchanged, byte for byte.
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=disable&search_path=a%2Cb", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable&search_path=a%2Cb"},
		{"password authentication failed for user app", "password authentication failed for user app"},
		{"http://accounts/{key}?from={version}", "http://accounts/{key}?from={version}"},
		{"", ""},
	} {
		if got := redact.String(tc.in); got != tc.want {
			t.Errorf("String(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
		if strings.Contains(redact.String(tc.in), "s3") {
			t.Errorf("String(%q) leaks the secret", tc.in)
		}
	}
}

// TestStringWithoutScheme: a URL whose scheme was left out still has its
// password masked, in a flag's value as in any text quoting it, whatever
// a URL parser makes of it; words that only look a little like one stay.
func TestStringWithoutScheme(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"user:S3cret@127.0.0.1:1", "user:xxxxx@127.0.0.1:1"},
		{"user:S3cret@sr.example", "user:xxxxx@sr.example"},
		{"user:S3cret@sr.example:8081/path?x=1", "user:xxxxx@sr.example:8081/path?x=1"},
		{"user:S3cret@h/db?token=S3cret&sslmode=disable", "user:xxxxx@h/db?token=xxxxx&sslmode=disable"},
		{"user:S3cret@[::1]:5432/db", "user:xxxxx@[::1]:5432/db"},
		{":S3cret@h:6379", ":xxxxx@h:6379"},
		// The password runs to the last @, as a URL parser takes it, and
		// may hold colons, slashes and equals signs.
		{"app:p@ss:w/rd=S3cret@db:5432", "app:xxxxx@db:5432"},
		// In text: quoted, after a flag, in a log's key=value.
		{`--registry-url user:S3cret@127.0.0.1:1: want an http:// or https:// URL`, `--registry-url user:xxxxx@127.0.0.1:1: want an http:// or https:// URL`},
		{`Get "user:S3cret@127.0.0.1:1/subjects": unsupported protocol scheme "user"`, `Get "user:xxxxx@127.0.0.1:1/subjects": unsupported protocol scheme "user"`},
		{"url=user:S3cret@h err=refused", "url=user:xxxxx@h err=refused"},
		{"cannot parse `user:S3cret@h`: bad", "cannot parse `user:xxxxx@h`: bad"},
		// Prose with a colon before an @ and a host after it reads as a
		// URL: masking it costs less than printing a password.
		{"see a:b@c for more", "see a:xxxxx@c for more"},
		// Nothing secret: unchanged, byte for byte.
		{"mail ops@example.com or admin@example.com", "mail ops@example.com or admin@example.com"},
		{"Reply to: ops@example.com", "Reply to: ops@example.com"},
		{"mailto:ops@example.com", "mailto:ops@example.com"},
		{"ghcr.io/projector-dev/projector:1.4@sha256:0123abcd", "ghcr.io/projector-dev/projector:1.4@sha256:0123abcd"},
		{"dial tcp 127.0.0.1:5432: connect: connection refused", "dial tcp 127.0.0.1:5432: connect: connection refused"},
		{"user@127.0.0.1:5432", "user@127.0.0.1:5432"},
		{"key a:b@ (no host)", "key a:b@ (no host)"},
		{"ratio 1:2 @ 3", "ratio 1:2 @ 3"},
	} {
		if got := redact.String(tc.in); got != tc.want {
			t.Errorf("String(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
		if strings.ContainsAny(tc.in, " `\"") {
			continue // URL is for a URL alone
		}
		if got := redact.URL(tc.in); strings.Contains(got, "S3cret") {
			t.Errorf("URL(%q) = %q leaks the secret", tc.in, got)
		}
	}
	err := redact.Error(errors.New("--registry-url user:S3cret@127.0.0.1:1: want a URL"))
	if strings.Contains(err.Error(), "S3cret") {
		t.Errorf("Error() = %q leaks the password", err)
	}
}

func TestErrorKeepsTheChain(t *testing.T) {
	cause := fmt.Errorf("open %q: %w", "postgres://u:s3cret@h/db", fs.ErrNotExist)
	err := redact.Error(cause)
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("Error() = %q leaks the password", err)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Error("errors.Is no longer sees the cause")
	}
	if redact.Error(nil) != nil {
		t.Error("Error(nil) is not nil")
	}
}

func TestReplaceAttr(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{ReplaceAttr: redact.ReplaceAttr}))
	log.Warn("retrying http://u:s3cret@sr/x", "err", errors.New(`GET "http://u:s3cret@sr/x": refused`),
		"url", "postgres://u:s3cret@h/db", "urls", []string{"http://u:s3cret@sr"},
		slog.Group("g", "dsn", "host=h password=s3cret"))
	if strings.Contains(buf.String(), "s3cret") {
		t.Errorf("log line leaks the password:\n%s", &buf)
	}
	if !strings.Contains(buf.String(), "u:xxxxx@sr") {
		t.Errorf("log line lost what is not secret:\n%s", &buf)
	}
}

func TestClip(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"short", "short"},
		{strings.Repeat("a", redact.MaxQuoted), strings.Repeat("a", redact.MaxQuoted)},
		{strings.Repeat("a", 100_000), strings.Repeat("a", redact.MaxQuoted) + "… (100000 bytes)"},
		// Cut at a character's start: é is two bytes.
		{"a" + strings.Repeat("é", redact.MaxQuoted), "a" + strings.Repeat("é", redact.MaxQuoted/2-1) + "… (" + strconv.Itoa(1+2*redact.MaxQuoted) + " bytes)"},
	} {
		if got := redact.Clip(tc.in); got != tc.want {
			t.Errorf("Clip(%.20q… of %d bytes) = %.40q… (%d bytes), want %.40q… (%d bytes)", tc.in, len(tc.in), got, len(got), tc.want, len(tc.want))
		}
	}
}
