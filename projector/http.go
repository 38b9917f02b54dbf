package projector

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ReadyFunc runs the readiness checks; a nil error is a passing check.
type ReadyFunc func(ctx context.Context) map[string]error

// Handler serves /metrics from g, /livez (and its alias /healthz), which
// checks nothing but the process, and /readyz, which runs ready; add
// ?verbose to list every check.
func Handler(g prometheus.Gatherer, ready ReadyFunc) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	live := func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }
	mux.HandleFunc("GET /livez", live)
	mux.HandleFunc("GET /healthz", live)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		checks := ready(r.Context())
		names := make([]string, 0, len(checks))
		failed := false
		for name, err := range checks {
			names = append(names, name)
			failed = failed || err != nil
		}
		slices.Sort(names)
		var b strings.Builder
		if r.URL.Query().Has("verbose") || failed {
			for _, name := range names {
				if err := checks[name]; err != nil {
					fmt.Fprintf(&b, "[-] %s failed: %v\n", name, err)
				} else {
					fmt.Fprintf(&b, "[+] %s ok\n", name)
				}
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if failed {
			w.WriteHeader(http.StatusServiceUnavailable)
			b.WriteString("not ready\n")
		} else {
			b.WriteString("ok\n")
		}
		fmt.Fprint(w, b.String())
	})
	return mux
}
