package projector

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ReadyFunc runs the readiness checks; a nil error is a passing check.
type ReadyFunc func(ctx context.Context) map[string]error

// Handler serves /metrics from g, /livez (and its alias /healthz), which
// runs the checks of live (such as Engine.Live; none or nil: the process
// answers), and /readyz, which runs ready; add ?verbose to list every
// check.
func Handler(g prometheus.Gatherer, ready ReadyFunc, live ...ReadyFunc) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	live = slices.DeleteFunc(live, func(f ReadyFunc) bool { return f == nil })
	livez := checksHandler(func(ctx context.Context) map[string]error {
		checks := map[string]error{}
		for _, f := range live {
			maps.Copy(checks, f(ctx))
		}
		return checks
	}, "not live")
	mux.Handle("GET /livez", livez)
	mux.Handle("GET /healthz", livez)
	mux.Handle("GET /readyz", checksHandler(ready, "not ready"))
	return mux
}

// checksHandler answers 200 when every check of run passes and 503
// listing them, then failed, when one fails; ?verbose lists them either
// way.
func checksHandler(run ReadyFunc, failed string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		checks := run(r.Context())
		names := make([]string, 0, len(checks))
		fails := false
		for name, err := range checks {
			names = append(names, name)
			fails = fails || err != nil
		}
		slices.Sort(names)
		var b strings.Builder
		if r.URL.Query().Has("verbose") || fails {
			for _, name := range names {
				if err := checks[name]; err != nil {
					fmt.Fprintf(&b, "[-] %s failed: %v\n", name, err)
				} else {
					fmt.Fprintf(&b, "[+] %s ok\n", name)
				}
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if fails {
			w.WriteHeader(http.StatusServiceUnavailable)
			b.WriteString(failed + "\n")
		} else {
			b.WriteString("ok\n")
		}
		fmt.Fprint(w, b.String())
	})
}
