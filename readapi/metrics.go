package readapi

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the API's request metrics, by route pattern (never the
// raw path, whose keys would make a series each).
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "projector_http_requests_total",
			Help: "HTTP requests the read and admin APIs answered, by route pattern and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "projector_http_request_duration_seconds",
			Help:    "How long the read and admin APIs took to answer a request, by route pattern, min_version waits included.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"route"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.duration} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("readapi: register metrics: %w", err)
			}
		}
	}
	// Each route's series exist from the start, so that a rate over them
	// is not missing until the first request.
	for _, r := range []string{routeRow, routeRows} {
		m.duration.WithLabelValues(r)
		m.requests.WithLabelValues(r, "200")
	}
	return m, nil
}

func (m *metrics) observe(route string, status int, took time.Duration) {
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(route).Observe(took.Seconds())
}
