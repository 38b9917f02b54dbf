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
	a.metrics.duration.WithLabelValues(route)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		subject := new(string)
		defer func() {
			took := time.Since(began)
			a.metrics.observe(route, rec.status, took)
			a.log.LogAttrs(r.Context(), slog.LevelInfo, "http request",
				slog.String("method", r.Method), slog.String("route", route), slog.String("path", r.URL.Path),
				slog.String("query", r.URL.RawQuery), slog.Int("status", rec.status), slog.Int64("bytes", rec.bytes),
				slog.Float64("duration_ms", float64(took.Microseconds())/1000), slog.String("subject", *subject),
				slog.String("remote", r.RemoteAddr))
		}()
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
