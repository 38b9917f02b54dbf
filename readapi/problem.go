package readapi

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Problem codes: the stable code member of every error response, which
// clients branch on (titles and details are for people and may change).
const (
	CodeNotFound          = "not_found"
	CodeBadFilter         = "bad_filter"
	CodeBadParameter      = "bad_parameter"
	CodeBadCursor         = "bad_cursor"
	CodeBodyNotAllowed    = "body_not_allowed"
	CodeVersionNotReached = "version_not_reached"
	CodeMinVersionNotHere = "min_version_not_served"
	CodeTooManyWaiters    = "too_many_waiters"
	CodeUnauthenticated   = "unauthenticated"
	CodeForbidden         = "forbidden"
	CodeMethodNotAllowed  = "method_not_allowed"
	CodeTimeout           = "timeout"
	CodeUnavailable       = "unavailable"
	CodeInternal          = "internal"
)

const (
	// problemTypePrefix begins each problem's type URI, the code after it.
	problemTypePrefix  = "https://projector.dev/problems/"
	problemContentType = "application/problem+json"
	// authenticateChallenge is the WWW-Authenticate of a 401 (RFC 6750).
	authenticateChallenge = `Bearer realm="projector"`
)

// problem is an RFC 9457 problem details object, with the stable code
// member and, for some codes, an extension member.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
	// CurrentVersion (version_not_reached) is the aggregate's version
	// when the wait ended; absent when no row is visible.
	CurrentVersion *int64 `json:"current_version,omitempty"`
	// Filterable (bad_filter) lists the columns a list may filter on.
	Filterable []string `json:"filterable,omitempty"`
}

// writeProblem answers p: every error of every route goes through it, so
// that errors have one shape.
func writeProblem(w http.ResponseWriter, p problem) {
	p.Type = problemTypePrefix + p.Code
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	h := w.Header()
	h.Set("Content-Type", problemContentType)
	h.Set("Cache-Control", "no-store")
	h.Del("ETag")
	if p.Status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", authenticateChallenge)
	}
	b, _ := json.Marshal(p) // a struct of strings and numbers
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(b, '\n'))
}
