package adminapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"

	"github.com/projector-dev/projector/internal/jsonbody"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/auth"
	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/readapi"
	"github.com/projector-dev/projector/rebuild"
)

// MaxBody bounds a request body.
const MaxBody = 1 << 20

// Problem codes of the admin API besides the read API's.
const (
	CodeBadRequest   = "bad_request"
	CodeBodyTooLarge = "body_too_large"
	CodeNotServed    = "not_served"
)

// Observer wraps each route with the metrics and access log of the API
// the admin API is served beside: a *readapi.API.
type Observer interface {
	Observe(route string, h http.Handler) http.Handler
}

// Config configures the admin API. DB, Identity and Authenticator are
// required.
type Config struct {
	// DB is a pool that may write: the admin API's actions write.
	DB *pgxpool.Pool
	// Identity is the consumer identity whose operations and offsets
	// the API acts on.
	Identity      string
	Authenticator auth.Authenticator
	// Observer, when set, counts and logs each request.
	Observer Observer
	// Offsets, when set, serves offset resets; without it they answer
	// 501 (not_served).
	Offsets OffsetResetter
	// Logger logs failures; nil discards.
	Logger *slog.Logger
}

// API is the admin API: an http.Handler to mount at /admin/.
type API struct {
	http.Handler
	routes []string
}

// Routes are the patterns ("METHOD /path") of the routes the API serves,
// for checking its OpenAPI document describes each.
func (a *API) Routes() []string { return slices.Clone(a.routes) }

// Handler returns the admin API of cfg, to be mounted at /admin/.
func Handler(cfg Config) (*API, error) {
	if cfg.DB == nil || cfg.Identity == "" || cfg.Authenticator == nil {
		return nil, errors.New("adminapi: DB, Identity and Authenticator are required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &server{cfg: cfg, log: log, heard: &heard{log: log, failed: map[string]bool{}}}
	mux := http.NewServeMux()
	a := &API{Handler: mux}
	handle := func(pattern, route string, h http.HandlerFunc) {
		if strings.Contains(pattern, " ") {
			a.routes = append(a.routes, pattern)
		}
		var hh http.Handler = s.authorize(h)
		if cfg.Observer != nil {
			hh = cfg.Observer.Observe(route, hh)
		}
		mux.Handle(pattern, hh)
	}
	handle("GET /admin/v1/dead-letters", "/admin/v1/dead-letters", s.listDeadLetters)
	handle("GET /admin/v1/dead-letters/{id}", "/admin/v1/dead-letters/{id}", s.showDeadLetter)
	handle("POST /admin/v1/dead-letters/redrives", "/admin/v1/dead-letters/redrives", s.redrive)
	handle("POST /admin/v1/dead-letters/purges", "/admin/v1/dead-letters/purges", s.purge)
	handle("POST /admin/v1/offsets/resets", "/admin/v1/offsets/resets", s.resetOffsets)
	rb := rebuild.NewHandler(rebuild.NewStore(cfg.DB), cfg.Identity, log, rebuild.HandlerOptions{
		Actor: func(r *http.Request) string { return subjectOf(r.Context()) },
		WriteError: func(w http.ResponseWriter, status int, code, message string) {
			readapi.WriteProblem(w, readapi.Problem{Status: status, Code: code, Detail: message})
		},
	})
	for _, p := range []string{
		"POST /admin/v1/projections/{name}/rebuilds",
		"POST /admin/v1/projections/{name}/rollbacks",
		"GET /admin/v1/operations",
		"GET /admin/v1/operations/{id}",
		"DELETE /admin/v1/operations/{id}",
	} {
		_, route, _ := strings.Cut(p, " ")
		handle(p, route, rb.ServeHTTP)
	}
	handle("/admin/", "/admin/other", func(w http.ResponseWriter, r *http.Request) {
		problem(w, http.StatusNotFound, readapi.CodeNotFound, fmt.Sprintf("no admin API route %s %s", r.Method, r.URL.Path))
	})
	return a, nil
}

type server struct {
	cfg   Config
	log   *slog.Logger
	heard *heard
}

// What heard tells failing and succeeding again.
const (
	whatAuthenticating = "authenticating requests"
	whatActing         = "acting on PostgreSQL or the brokers"
)

type principalKey struct{}

// authorize lets a request with the admin scope through to h: 401
// without valid credentials, 403 without the scope.
func (s *server) authorize(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := s.cfg.Authenticator.Authenticate(r)
		if err != nil {
			if errors.Is(err, auth.ErrUnauthenticated) {
				problem(w, http.StatusUnauthorized, readapi.CodeUnauthenticated, "a valid bearer token is required")
				return
			}
			s.heard.failure(r.Context(), whatAuthenticating, err)
			problem(w, http.StatusServiceUnavailable, readapi.CodeUnavailable, "the request could not be authenticated now")
			return
		}
		s.heard.success(r.Context(), whatAuthenticating)
		readapi.SetSubject(r.Context(), p.Subject)
		if !p.Allows(auth.ScopeAdmin) {
			problem(w, http.StatusForbidden, readapi.CodeForbidden, "the admin API needs scope "+auth.ScopeAdmin)
			return
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h(sw, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
		if sw.status < http.StatusInternalServerError {
			s.heard.success(r.Context(), whatActing)
		}
	}
}

// statusWriter keeps the status of a response, for heard.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

// subjectOf is the authenticated subject of the request of ctx.
func subjectOf(ctx context.Context) string {
	p, _ := ctx.Value(principalKey{}).(auth.Principal)
	if p.Subject == "" {
		return "anonymous"
	}
	return p.Subject
}

// actorOf is who does the action of the request of ctx, for the audit
// rows: the authenticated subject; the database session user is taken
// by the statement that writes the row, and there is no operating-system
// user of a request.
func actorOf(ctx context.Context) deadletters.Actor {
	return deadletters.Actor{Name: subjectOf(ctx)}
}

func problem(w http.ResponseWriter, status int, code, detail string) {
	readapi.WriteProblem(w, readapi.Problem{Status: status, Code: code, Detail: detail})
}

func badRequest(w http.ResponseWriter, detail string) {
	problem(w, http.StatusBadRequest, CodeBadRequest, detail)
}

// fail answers an unexpected error: a 500 whose detail only the log has,
// once while such failures go on.
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	s.heard.failure(r.Context(), whatActing, err, "method", r.Method, "path", r.URL.Path)
	problem(w, http.StatusInternalServerError, readapi.CodeInternal, "the request failed; the server's log has the detail")
}

// decode reads r's JSON body into v, refusing unknown fields, more than
// one value and bodies over MaxBody; it answers the error itself and
// reports whether to go on. A body is required.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			problem(w, http.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Sprintf("the body is larger than %d bytes", MaxBody))
			return false
		}
		badRequest(w, fmt.Sprintf("read the body: %v", err))
		return false
	}
	if len(bytes.TrimSpace(b)) == 0 {
		badRequest(w, "the body: want a JSON object")
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		badRequest(w, "the body: "+jsonbody.DecodeError(err))
		return false
	}
	if dec.More() {
		badRequest(w, "the body: want one JSON object, found more after it")
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away
}
