package repair

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/projection"
)

// fixtureServer serves data the way an HTTP repair source would: the
// highest snapshot of a key, or all of a key's events (history included, in
// the order held), 404 for an unknown key.
func fixtureServer(t *testing.T, data fixture) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /aggregates/{key}/from/{version}", func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		var body any
		if data.eventsShaped() {
			var evs []map[string]any
			for _, e := range data.events {
				if e.key != key {
					continue
				}
				fields := json.RawMessage("null")
				if e.fields != "" {
					fields = json.RawMessage(e.fields)
				}
				evs = append(evs, map[string]any{"version": e.version, "type": e.typ, "fields": fields})
			}
			if evs != nil {
				body = map[string]any{"events": evs}
			}
		} else {
			var best *snapshotRow
			for i, s := range data.snapshots {
				if s.key == key && (best == nil || s.version > best.version) {
					best = &data.snapshots[i]
				}
			}
			if best != nil {
				body = map[string]any{"version": best.version, "state": json.RawMessage(best.state)}
			}
		}
		if body == nil {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(body); err != nil {
			t.Errorf("encode: %v", err)
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func newTestHTTP(t *testing.T, cfg HTTPConfig, client *http.Client) *HTTP {
	t.Helper()
	h, err := NewHTTP(cfg, client)
	if err != nil {
		t.Fatalf("NewHTTP: %v", err)
	}
	return h
}

func TestHTTPConformance(t *testing.T) {
	runConformance(t, func(t *testing.T, data fixture) Repairer {
		srv := fixtureServer(t, data)
		return newTestHTTP(t, HTTPConfig{URL: srv.URL + "/aggregates/{key}/from/{version}"}, nil)
	})
}

// serve returns an HTTP repair source whose every request is answered by h.
func serve(t *testing.T, h http.HandlerFunc) (*HTTP, *httptest.Server) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return newTestHTTP(t, HTTPConfig{URL: srv.URL + "/{key}/{version}"}, srv.Client()), srv
}

func TestHTTPStatus(t *testing.T) {
	for _, tc := range []struct {
		code      int
		transient bool
		notFound  bool
	}{
		{http.StatusServiceUnavailable, true, false},
		{http.StatusInternalServerError, true, false},
		{http.StatusBadGateway, true, false},
		{http.StatusTooManyRequests, true, false},
		{http.StatusBadRequest, false, false},
		{http.StatusUnauthorized, false, false},
		{http.StatusGone, false, false},
		{http.StatusNoContent, false, false},
		{http.StatusNotFound, false, true},
	} {
		t.Run(http.StatusText(tc.code), func(t *testing.T) {
			t.Parallel()
			h, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.code)
				if tc.code != http.StatusNoContent {
					w.Write([]byte("upstream says no\n"))
				}
			})
			_, err := h.Repair(t.Context(), "k", 1)
			if err == nil {
				t.Fatal("Repair succeeded")
			}
			if got := IsTransient(err); got != tc.transient {
				t.Errorf("IsTransient(%v) = %v, want %v", err, got, tc.transient)
			}
			if got := errors.Is(err, ErrNotFound); got != tc.notFound {
				t.Errorf("errors.Is(%v, ErrNotFound) = %v, want %v", err, got, tc.notFound)
			}
			if !tc.notFound && !strings.Contains(err.Error(), http.StatusText(tc.code)) {
				t.Errorf("error %q does not name the status", err)
			}
			if !tc.notFound && tc.code != http.StatusNoContent && !strings.Contains(err.Error(), "upstream says no") {
				t.Errorf("error %q does not quote the body", err)
			}
		})
	}
}

func TestHTTPURL(t *testing.T) {
	type seen struct{ rawPath, pathKey, queryKey, version, auth, accept string }
	got := make(chan seen, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /agg/{key}/v/{version}", func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.URL.EscapedPath(), r.PathValue("key"), r.URL.Query().Get("id"), r.PathValue("version"), r.Header.Get("Authorization"), r.Header.Get("Accept")}
		w.Write([]byte(`{"version": 9, "state": {}}`))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	header := http.Header{"Authorization": {"Bearer t"}}
	h := newTestHTTP(t, HTTPConfig{URL: srv.URL + "/agg/{key}/v/{version}?id={key}&x=1", Header: header}, nil)
	header.Set("Authorization", "changed after NewHTTP")

	key := "a/b c&d?e%f"
	res, err := h.Repair(t.Context(), key, 7)
	if err != nil {
		t.Fatalf("Repair: %v", err)
	}
	if res.Version != 9 || res.Snapshot == nil || len(res.Snapshot) != 0 {
		t.Errorf("Repair = %#v", res)
	}
	want := seen{
		rawPath: "/agg/a%2Fb%20c&d%3Fe%25f/v/7", pathKey: key, queryKey: key, version: "7",
		auth: "Bearer t", accept: "application/json",
	}
	if s := <-got; s != want {
		t.Errorf("server saw %+v\nwant      %+v", s, want)
	}
}

// TestHTTPDotKeys asks about the keys "." and "..": each must reach the
// source as one path segment of the template, never as a dot segment a
// server or proxy resolves (/internal/accounts/../events is
// /internal/events, requested with the source's credentials).
func TestHTTPDotKeys(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.RequestURI)
		http.NotFound(w, r)
	}))
	defer srv.Close()
	h := newTestHTTP(t, HTTPConfig{URL: srv.URL + "/internal/accounts/{key}/events?id={key}"}, nil)
	for _, key := range []string{".", "..", "../..", "a/../b", "..."} {
		if _, err := h.Repair(t.Context(), key, 2); !errors.Is(err, ErrNotFound) {
			t.Errorf("Repair(%q) = %v, want ErrNotFound", key, err)
		}
	}
	want := []string{
		"/internal/accounts/%2E/events?id=.",
		"/internal/accounts/%2E%2E/events?id=..",
		"/internal/accounts/..%2F../events?id=..%2F..",
		"/internal/accounts/a%2F..%2Fb/events?id=a%2F..%2Fb",
		"/internal/accounts/.../events?id=...",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the source was asked for\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, uri := range got {
		for _, seg := range strings.Split(strings.SplitN(uri, "?", 2)[0], "/") {
			if seg == "." || seg == ".." {
				t.Errorf("request %s has a dot segment", uri)
			}
		}
	}
}

func TestHTTPTimeout(t *testing.T) {
	block := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	check := func(t *testing.T, err error) {
		t.Helper()
		if err == nil {
			t.Fatal("Repair succeeded")
		}
		if !IsTransient(err) {
			t.Errorf("IsTransient(%v) = false", err)
		}
	}

	t.Run("config timeout, default client", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(block))
		t.Cleanup(srv.Close)
		h := newTestHTTP(t, HTTPConfig{URL: srv.URL + "/{key}", Timeout: 50 * time.Millisecond}, nil)
		_, err := h.Repair(t.Context(), "k", 1)
		check(t, err)
	})
	t.Run("config timeout, own client without one", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(block))
		t.Cleanup(srv.Close)
		h := newTestHTTP(t, HTTPConfig{URL: srv.URL + "/{key}", Timeout: 50 * time.Millisecond}, srv.Client())
		_, err := h.Repair(t.Context(), "k", 1)
		check(t, err)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("error %v is not context.DeadlineExceeded", err)
		}
	})
	t.Run("caller deadline", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(block))
		t.Cleanup(srv.Close)
		h := newTestHTTP(t, HTTPConfig{URL: srv.URL + "/{key}", Timeout: time.Hour}, srv.Client())
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		_, err := h.Repair(ctx, "k", 1)
		check(t, err)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("error %v is not context.DeadlineExceeded", err)
		}
	})
	t.Run("caller cancels", func(t *testing.T) {
		t.Parallel()
		started := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(started)
			<-r.Context().Done()
		}))
		t.Cleanup(srv.Close)
		h := newTestHTTP(t, HTTPConfig{URL: srv.URL + "/{key}", Timeout: time.Hour}, srv.Client())
		ctx, cancel := context.WithCancel(t.Context())
		go func() { <-started; cancel() }()
		_, err := h.Repair(ctx, "k", 1)
		if err == nil || IsTransient(err) || !errors.Is(err, context.Canceled) {
			t.Errorf("Repair after cancel = %v, want a non-transient context.Canceled", err)
		}
	})
}

func TestHTTPConnectionRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	h := newTestHTTP(t, HTTPConfig{URL: srv.URL + "/{key}"}, nil)
	srv.Close()
	_, err := h.Repair(t.Context(), "k", 1)
	if err == nil || !IsTransient(err) {
		t.Fatalf("Repair against a closed server = %v, want a transient error", err)
	}
}

func TestHTTPConnectionDropped(t *testing.T) {
	h, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(`{"version": 1,`))
		// Returning with less than Content-Length written drops the connection.
	})
	_, err := h.Repair(t.Context(), "k", 1)
	if err == nil || !IsTransient(err) {
		t.Fatalf("Repair with a truncated body = %v, want a transient error", err)
	}
}

func TestHTTPBadBody(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{"empty", ``, "no JSON value"},
		{"not JSON", `<html>`, "invalid JSON"},
		{"truncated", `{"version": 3, "state": {`, "invalid JSON"},
		{"trailing data", `{"version": 3, "state": {}} {}`, "data after the value"},
		{"array", `[]`, "want a JSON object, got an array"},
		{"null", `null`, "want a JSON object, got null"},
		{"neither", `{"version": 3}`, `neither "state" nor "events"`},
		{"both", `{"version": 3, "state": {}, "events": []}`, `both "state" and "events"`},
		{"state without version", `{"state": {}}`, `"state" without "version"`},
		{"version string", `{"version": "3", "state": {}}`, "version: want an integer, got a string"},
		{"version fraction", `{"version": 3.5, "state": {}}`, "version: want an integer, got 3.5"},
		{"state array", `{"version": 3, "state": [1]}`, "state: want a JSON object, got an array"},
		{"state null", `{"version": 3, "state": null}`, "state: want a JSON object, got null"},
		{"events object", `{"events": {}}`, "events: want an array, got an object"},
		{"event not object", `{"events": [1]}`, "events[0]: want a JSON object, got a number"},
		{"event without version", `{"events": [{"type": "x"}]}`, `events[0]: no "version"`},
		{"event type number", `{"events": [{"version": 3, "type": 1}]}`, "events[0]: type: want a string, got a number"},
		{"event fields array", `{"events": [{"version": 3, "fields": []}]}`, "events[0]: fields: want a JSON object, got an array"},
		{"number too big", `{"events": [{"version": 3, "fields": {"n": 1e999}}]}`, "fields: n: number 1e999 does not fit a float64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, _ := serve(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(tc.body)) })
			res, err := h.Repair(t.Context(), "k", 3)
			if err == nil {
				t.Fatalf("Repair = %#v, want an error", res)
			}
			if IsTransient(err) || errors.Is(err, ErrNotFound) {
				t.Errorf("error %v: transient %v, not found %v; want neither", err, IsTransient(err), errors.Is(err, ErrNotFound))
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func TestHTTPBodyShapes(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Result
	}{
		{"empty events list", `{"events": []}`, Result{}},
		{"type and fields left out", `{"events": [{"version": 3}, {"version": 4, "type": null, "fields": null}], "extra": 1}`,
			Result{Version: 4, Events: []projection.Event{{Key: "k", Version: 3}, {Key: "k", Version: 4}}}},
		{"numbers", `{"version": 3.0, "state": {"i": -7, "f": 1.25, "e": 1e3, "big": 9223372036854775807, "huge": 1e20, "neg": -0.5}}`,
			Result{Version: 3, Snapshot: projection.Row{"i": int64(-7), "f": 1.25, "e": int64(1000), "big": int64(9223372036854775807), "huge": 1e20, "neg": -0.5}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, _ := serve(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(tc.body)) })
			res, err := h.Repair(t.Context(), "k", 3)
			if reflect.DeepEqual(tc.want, Result{}) {
				if !errors.Is(err, ErrNotFound) {
					t.Fatalf("Repair = %#v, %v; want ErrNotFound", res, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Repair: %v", err)
			}
			if !reflect.DeepEqual(res, tc.want) {
				t.Fatalf("Repair = %#v\nwant %#v", res, tc.want)
			}
		})
	}
}

func TestNewHTTPValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  HTTPConfig
		want string
	}{
		{"no url", HTTPConfig{}, "url is required"},
		{"no key", HTTPConfig{URL: "http://h/agg/{version}"}, "no {key}"},
		{"unparsable", HTTPConfig{URL: "http://h:port/{key}"}, "invalid port"},
		{"relative", HTTPConfig{URL: "/agg/{key}"}, "scheme must be http or https"},
		{"other scheme", HTTPConfig{URL: "ftp://h/{key}"}, "scheme must be http or https"},
		{"no host", HTTPConfig{URL: "http:///{key}"}, "no host"},
		{"unknown placeholder", HTTPConfig{URL: "http://h/{key}/{Version}"}, "unknown placeholder {Version}"},
		{"negative timeout", HTTPConfig{URL: "http://h/{key}", Timeout: -time.Second}, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := NewHTTP(tc.cfg, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewHTTP(%+v) = %v, %v; want an error mentioning %q", tc.cfg, h, err, tc.want)
			}
		})
	}
	h, err := NewHTTP(HTTPConfig{URL: "https://h/{key}"}, nil)
	if err != nil {
		t.Fatalf("NewHTTP: %v", err)
	}
	if h.timeout != defaultHTTPTimeout || h.client.Timeout != defaultHTTPTimeout {
		t.Errorf("timeouts = %v, %v; want the default %v", h.timeout, h.client.Timeout, defaultHTTPTimeout)
	}
}
