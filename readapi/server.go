package readapi

import (
	"net/http"
	"time"
)

// Server limits: a client that sends its headers slowly, holds an idle
// connection or reads its answer slowly is cut off rather than holding
// a connection. WriteTimeout leaves room for the longest min_version
// wait and the query after it.
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 10 * time.Second
	WriteTimeout      = MaxWait + 15*time.Second
	IdleTimeout       = 120 * time.Second
	MaxHeaderBytes    = 16 << 10
)

// NewServer returns an HTTP server of h with the API's timeouts and
// header limit.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}
