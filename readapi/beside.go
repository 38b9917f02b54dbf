package readapi

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// Problem is an error answer of a route served beside the API's (the
// admin API), in the API's one shape: an RFC 9457 problem whose code is
// stable.
type Problem struct {
	Status int
	Code   string
	Detail string
}

// WriteProblem answers p as the API answers its own errors.
func WriteProblem(w http.ResponseWriter, p Problem) {
	writeProblem(w, problem{Status: p.Status, Code: p.Code, Detail: p.Detail})
}

type subjectKey struct{}

// Observe wraps h, a route served beside the API's (the admin API's),
// with the API's request metrics and access log under route, the
// pattern the metrics' route label names. h tells the access log who
// asked with SetSubject.
func (a *API) Observe(route string, h http.Handler) http.Handler {
	m := a.metrics.route(route)
	m.duration() // its series exists from the start
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		subject := new(string)
		defer a.served(m, r, rec, time.Now(), subject)
		h.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), subjectKey{}, subject)))
	})
}

// SetSubject records the authenticated subject of the request of ctx
// for Observe's access log line.
func SetSubject(ctx context.Context, subject string) {
	if p, ok := ctx.Value(subjectKey{}).(*string); ok {
		*p = subject
	}
}

// Logger is the API's logger, for routes served beside it.
func (a *API) Logger() *slog.Logger { return a.log }
