package embedded

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// Registry is an in-process Schema Registry served on an address of the
// caller's choosing.
type Registry struct {
	*srfake.Registry
	url  string
	srv  *http.Server
	done chan error
	once sync.Once
}

// NewRegistry starts an in-process Schema Registry listening on addr
// (host:port; a port of 0 picks a free one; empty: 127.0.0.1 on a free
// port). Close stops it.
func NewRegistry(addr string) (*Registry, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("start the embedded registry on %s: %w", addr, err)
	}
	r := &Registry{
		Registry: srfake.NewRegistry(),
		url:      "http://" + ln.Addr().String(),
		done:     make(chan error, 1),
	}
	r.srv = &http.Server{Handler: r.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		err := r.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		r.done <- err
	}()
	return r, nil
}

// URL is the registry's base URL, e.g. http://127.0.0.1:8081.
func (r *Registry) URL() string { return r.url }

// Close stops serving and waits for the server to end; it may be called
// more than once.
func (r *Registry) Close() {
	r.once.Do(func() {
		r.srv.Close()
		<-r.done
	})
}
