package repair

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/projection"
)

// defaultHTTPTimeout is the HTTPConfig.Timeout used when none is set.
const defaultHTTPTimeout = 5 * time.Second

// maxBody is the largest response body read.
const maxBody = 32 << 20

// HTTPConfig configures an HTTP repair source.
type HTTPConfig struct {
	// URL is the template of the URL to GET. {key} is replaced by the
	// aggregate id, path-escaped ('/' becomes %2F, and the keys "." and
	// ".." become %2E and %2E%2E, so that they stay one segment), or
	// query-escaped where it appears after the '?'; {version} by the
	// missing version. {key} is
	// required, {version} optional.
	URL string
	// Timeout bounds each request, reading the body included. Default 5s.
	Timeout time.Duration
	// Header is sent with every request, e.g. Authorization.
	Header http.Header
}

// HTTP is a repair source that GETs the aggregate's state or its missing
// events from a URL. The response is 200 with a JSON body, either a snapshot
//
//	{"version": 7, "state": {"id": "a", "total": 12.5}}
//
// or the events from the missing version on (those before it are ignored)
//
//	{"events": [{"version": 5, "type": "Added", "fields": {"n": 1}}, ...]}
//
// where an event's type may be omitted and its fields may be null or
// omitted (a tombstone). 404, or an empty events list, is ErrNotFound; 5xx
// and 429 are transient; any other status is an error.
type HTTP struct {
	tmpl    string
	timeout time.Duration
	header  http.Header
	client  *http.Client
}

var placeholderRe = regexp.MustCompile(`\{[A-Za-z_]*\}`)

// NewHTTP checks cfg and returns an HTTP repair source. A nil client means a
// default client with cfg.Timeout; a given client's own timeout is left as
// it is, but each request is still bounded by cfg.Timeout.
func NewHTTP(cfg HTTPConfig, client *http.Client) (*HTTP, error) {
	if cfg.URL == "" {
		return nil, errors.New("http repair source: url is required")
	}
	if !strings.Contains(cfg.URL, "{key}") {
		return nil, fmt.Errorf("http repair source: url %q has no {key} placeholder", redact.URL(cfg.URL))
	}
	for _, p := range placeholderRe.FindAllString(cfg.URL, -1) {
		if p != "{key}" && p != "{version}" {
			return nil, fmt.Errorf("http repair source: url %q: unknown placeholder %s, want {key} or {version}", redact.URL(cfg.URL), p)
		}
	}
	switch {
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("http repair source: timeout %s is negative", cfg.Timeout)
	case cfg.Timeout == 0:
		cfg.Timeout = defaultHTTPTimeout
	}
	h := &HTTP{tmpl: cfg.URL, timeout: cfg.Timeout, header: cfg.Header.Clone(), client: client}
	u, err := url.Parse(h.url("key", 1))
	if err != nil {
		return nil, fmt.Errorf("http repair source: url %q: %v", redact.URL(cfg.URL), redact.Error(errors.Unwrap(err)))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("http repair source: url %q: scheme must be http or https", redact.URL(cfg.URL))
	}
	if u.Host == "" {
		return nil, fmt.Errorf("http repair source: url %q has no host", redact.URL(cfg.URL))
	}
	if h.client == nil {
		h.client = &http.Client{Timeout: cfg.Timeout}
	}
	return h, nil
}

// url fills in the template.
func (h *HTTP) url(key string, missing int64) string {
	path, query, hasQuery := strings.Cut(h.tmpl, "?")
	v := strconv.FormatInt(missing, 10)
	u := strings.NewReplacer("{key}", pathSegment(key), "{version}", v).Replace(path)
	if hasQuery {
		u += "?" + strings.NewReplacer("{key}", url.QueryEscape(key), "{version}", v).Replace(query)
	}
	return u
}

// pathSegment escapes key as one path segment. url.PathEscape leaves the
// keys "." and ".." as they are, and a server or proxy resolves them as
// dot segments (/accounts/../events is /events, sent with the source's
// credentials); their dots are percent-encoded, which RFC 3986 says is
// not a dot segment.
func pathSegment(key string) string {
	if key == "." || key == ".." {
		return strings.Repeat("%2E", len(key))
	}
	return url.PathEscape(key)
}

// Repair GETs the aggregate's state at or beyond missing.
func (h *HTTP) Repair(ctx context.Context, key string, missing int64) (Result, error) {
	fail := func(err error) (Result, error) {
		return Result{}, fmt.Errorf("repair %q from version %d: %w", key, missing, err)
	}
	if err := checkMissing(missing); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	target := h.url(key, missing)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fail(err)
	}
	if h.header != nil {
		req.Header = h.header.Clone()
	}
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", "application/json")
	}
	resp, err := h.client.Do(req)
	if err != nil {
		// The error quotes the URL, which may carry credentials.
		return fail(redact.Error(err))
	}
	defer resp.Body.Close()
	where := "GET " + redact.URL(req.URL.String())
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return fail(fmt.Errorf("%s: %w", where, ErrNotFound))
	default:
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return fail(fmt.Errorf("%s: %w", where, &statusError{
			code:   resp.StatusCode,
			status: resp.Status,
			body:   strings.TrimSpace(strings.ToValidUTF8(string(snippet), "?")),
		}))
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return fail(fmt.Errorf("%s: read body: %w", where, err))
	}
	if len(body) > maxBody {
		return fail(fmt.Errorf("%s: response body is larger than %d bytes", where, maxBody))
	}
	res, err := decodeHTTPBody(key, missing, body)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return fail(fmt.Errorf("%s: %w", where, err))
		}
		return fail(fmt.Errorf("%s: response: %w", where, err))
	}
	return res, nil
}

// decodeHTTPBody decodes and checks a 200 response body.
func decodeHTTPBody(key string, missing int64, body []byte) (Result, error) {
	top, err := decodeObject(body)
	if err != nil {
		return Result{}, err
	}
	if top == nil {
		return Result{}, errors.New("want a JSON object, got null")
	}
	rawState, hasState := top["state"]
	rawEvents, hasEvents := top["events"]
	switch {
	case hasState && hasEvents:
		return Result{}, errors.New(`both "state" and "events": want one of them`)
	case hasState:
		rawVersion, ok := top["version"]
		if !ok {
			return Result{}, errors.New(`"state" without "version"`)
		}
		version, err := decodeVersion(rawVersion)
		if err != nil {
			return Result{}, fmt.Errorf("version: %v", err)
		}
		state, err := decodeState(rawState)
		if err != nil {
			return Result{}, fmt.Errorf("state: %v", err)
		}
		return snapshotResult(missing, version, state)
	case hasEvents:
		if k := kindOf(rawEvents); k != '[' {
			return Result{}, fmt.Errorf("events: want an array, got %s", kindName(k))
		}
		var raws []json.RawMessage
		if err := decodeValue(rawEvents, &raws); err != nil {
			return Result{}, fmt.Errorf("events: %v", err)
		}
		events := make([]projection.Event, 0, len(raws))
		for i, raw := range raws {
			ev, err := decodeHTTPEvent(raw)
			if err != nil {
				return Result{}, fmt.Errorf("events[%d]: %v", i, err)
			}
			events = append(events, ev)
		}
		return eventsResult(key, missing, events)
	}
	return Result{}, errors.New(`neither "state" nor "events"`)
}

func decodeHTTPEvent(raw json.RawMessage) (projection.Event, error) {
	m, err := decodeObject(raw)
	if err != nil {
		return projection.Event{}, err
	}
	if m == nil {
		return projection.Event{}, errors.New("want a JSON object, got null")
	}
	var ev projection.Event
	rawVersion, ok := m["version"]
	if !ok {
		return ev, errors.New(`no "version"`)
	}
	if ev.Version, err = decodeVersion(rawVersion); err != nil {
		return ev, fmt.Errorf("version: %v", err)
	}
	if rawType, ok := m["type"]; ok {
		switch k := kindOf(rawType); k {
		case '"':
			if err := decodeValue(rawType, &ev.Type); err != nil {
				return ev, fmt.Errorf("type: %v", err)
			}
		case 'n':
		default:
			return ev, fmt.Errorf("type: want a string, got %s", kindName(k))
		}
	}
	if rawFields, ok := m["fields"]; ok {
		if ev.Fields, err = decodeFields(rawFields); err != nil {
			return ev, fmt.Errorf("fields: %v", err)
		}
	}
	return ev, nil
}
